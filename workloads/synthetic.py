"""Synthetic agent sessions generated from a :class:`~workloads.spec.WorkloadSpec`.

Session k depends only on (spec, seed, k):

* the tenant is drawn by weight from ``seed:k:tenant``;
* each aspect has its own RNG stream (``turns``, ``role``, ``user``, ``tool``, ``output``, ``think``,
  ``text``), so changing one knob leaves the draws of the others as they were;
* the system prompt comes from (seed, tenant) only: every session of a tenant sends the same text;
* texts come from the workload's tokenizer (``workloads.text``: loadgen's own unless
  ``--tokenizer`` names another), so a turn built for N tokens is exactly N tokens to it.

Turn 0 is a user message (``first_user_tokens``) with no think time. Each follow-up is a tool result
with probability ``tool_turn_fraction`` (``tool_output_tokens``, waiting ``tool_time`` first) and
otherwise a user message (``user_tokens``, waiting ``think_time``). With ``cold_prefill`` every turn
is marked ``cold``: the runtime puts a unique nonce at the very start of that request's prompt.

A spec with ``steps`` gives DAG sessions instead (:mod:`workloads.steps`): the steps in order, each
repeated ``repeat`` times, a ``fan_out`` as ``k`` children (step ids ``<id>.<i>``) and the step after
it as their join. ``k`` and ``repeat`` are drawn from the ``steps`` stream; the texts, sizes and
waits from the same streams as a chain's, in step order.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from workloads.distributions import Distribution
from workloads.model import STEP_FAN_OUT_CHILD, STEP_FIRST, STEP_FOLLOW_UP, STEP_JOIN, Session, Turn
from workloads.spec import Knobs, TenantSpec, WorkloadSpec
from workloads.steps import STEP_FAN_OUT, STEP_TOOL, StepSpec
from workloads.workload import (
    Workload,
    check_seed_index,
    session_id,
    session_rng,
    system_prompt_text,
)


class SyntheticWorkload(Workload):
    """Unbounded synthetic sessions from a validated spec."""

    kind = "synthetic"

    def __init__(self, spec: WorkloadSpec, *, source: str):
        self.spec = spec
        self.name = spec.name
        self.source = source
        self._names = [t.name for t in spec.tenants]
        self._weights = [t.weight for t in spec.tenants]
        # Cache of (seed, tenant) -> system prompt: generating a 4k-token prompt per session is waste.
        self._system_prompts: dict[tuple[int, str], str] = {}

    @property
    def num_sessions(self) -> None:
        return None

    @property
    def tenants(self) -> tuple[str, ...]:
        return tuple(self._names)

    def system_prompt(self, seed: int, tenant: str) -> str:
        """The system prompt every session of ``tenant`` sends under ``seed``."""
        key = (seed, tenant)
        text = self._system_prompts.get(key)
        if text is None:
            spec = self._tenant(tenant)
            n = spec.knobs.system_prompt_tokens.sample(random.Random(f"{seed}:system:{tenant}"))
            text = system_prompt_text(seed, tenant, int(n), self.tokenizer)
            self._system_prompts[key] = text
        return text

    def _tenant(self, name: str) -> TenantSpec:
        return self.spec.tenants[self._names.index(name)]

    def session(self, seed: int, index: int) -> Session:
        check_seed_index(seed, index, None, where=self.source)

        def rng(stream: str) -> random.Random:
            return session_rng(seed, index, stream)

        if len(self._names) == 1:
            tenant = self.spec.tenants[0]
        else:
            tenant = self._tenant(rng("tenant").choices(self._names, self._weights)[0])
        k = tenant.knobs
        if k.steps is not None:
            turns = tuple(_dag_turns(k, k.steps, rng, self.tokenizer.text))
            return Session(
                session_id=session_id(seed, index),
                tenant=tenant.name,
                system_prompt=self.system_prompt(seed, tenant.name),
                turns=turns,
                index=index,
                meta={"workload": self.name},
            )
        n_turns = max(1, int(k.turns.sample(rng("turns"))))
        r_role, r_user, r_tool = rng("role"), rng("user"), rng("tool")
        r_output, r_think, r_text = rng("output"), rng("think"), rng("text")
        turns: list[Turn] = []
        for i in range(n_turns):
            if i == 0:
                role, n_in, think = "user", k.first_user_tokens.sample(r_user), 0.0
            elif r_role.random() < k.tool_turn_fraction:
                role, n_in, think = "tool", k.tool_output_tokens.sample(r_tool), k.tool_time.sample(r_think)
            else:
                role, n_in, think = "user", k.user_tokens.sample(r_user), k.think_time.sample(r_think)
            turns.append(
                Turn(
                    content=self.tokenizer.text(max(1, int(n_in)), r_text),
                    max_tokens=max(1, int(k.output_tokens.sample(r_output))),
                    think_time_s=float(think),
                    role=role,
                    cold=k.cold_prefill,
                )
            )
        return Session(
            session_id=session_id(seed, index),
            tenant=tenant.name,
            system_prompt=self.system_prompt(seed, tenant.name),
            turns=tuple(turns),
            index=index,
            meta={"workload": self.name},
        )

    def fingerprint(self) -> str:
        return self.with_tokenizer(self.spec.fingerprint())

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "source": self.source,
            "fingerprint": self.fingerprint(),
            "spec": self.spec.to_dict(),
        }


def _dag_turns(k: Knobs, steps: tuple[StepSpec, ...], rng, text: Callable[[int, random.Random], str]) -> list[Turn]:
    """The turns of one DAG session: step templates expanded (repeats, fan-out children, joins)."""
    r_steps, r_user, r_tool = rng("steps"), rng("user"), rng("tool")
    r_output, r_think, r_text = rng("output"), rng("think"), rng("text")
    turns: list[Turn] = []
    joins_next = False  # the step after a fan-out is its join
    parents: tuple[str, ...] = ()  # what the next step waits for: the last step, or a fan-out's children

    def draw(d: Distribution | None, default: Distribution, r) -> float:
        return (d or default).sample(r)

    for step in steps:
        if step.kind == STEP_FAN_OUT:
            n_children = max(1, int(step.k.sample(r_steps)))  # type: ignore[union-attr]
            tool = step.tool if step.join_as == "tool" else None
            children = []
            for i in range(n_children):
                n_in = draw(step.input_tokens, k.user_tokens, r_user)
                turns.append(
                    Turn(
                        content=text(max(1, int(n_in)), r_text),
                        max_tokens=max(1, int(draw(step.output_tokens, k.output_tokens, r_output))),
                        cold=k.cold_prefill,
                        step_id=f"{step.step_id}.{i}",
                        kind=STEP_FAN_OUT_CHILD,
                        parent_ids=parents,
                        tool_call=tool,
                    )
                )
                children.append(f"{step.step_id}.{i}")
            parents = tuple(children)
            joins_next = True
            continue
        repeat = 1 if step.repeat is None else max(1, int(step.repeat.sample(r_steps)))
        for r in range(repeat):
            first = not turns
            if step.kind == STEP_TOOL:
                n_in = draw(step.input_tokens, k.tool_output_tokens, r_tool)  # type: ignore[arg-type]
                think = draw(step.tool_time, k.tool_time, r_think)
                role = "tool"
            else:
                default_in = k.first_user_tokens if first else k.user_tokens
                n_in = draw(step.input_tokens, default_in, r_user)
                think = 0.0 if first else draw(step.think_time, k.think_time, r_think)
                role = "user"
            kind = STEP_FIRST if first else (STEP_JOIN if joins_next else STEP_FOLLOW_UP)
            joins_next = False
            sid = step.step_id if r == 0 else f"{step.step_id}.{r}"
            turns.append(
                Turn(
                    content=text(max(1, int(n_in)), r_text),
                    max_tokens=max(1, int(draw(step.output_tokens, k.output_tokens, r_output))),
                    think_time_s=float(think),
                    role=role,
                    cold=k.cold_prefill,
                    step_id=sid,
                    kind=kind,
                    parent_ids=parents,
                    tool_call=step.tool if step.kind == STEP_TOOL else None,
                )
            )
            parents = (sid,)
    return turns
