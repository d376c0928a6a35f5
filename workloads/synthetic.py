"""Synthetic agent sessions generated from a :class:`~workloads.spec.WorkloadSpec`.

Session k depends only on (spec, seed, k):

* the tenant is drawn by weight from ``seed:k:tenant``;
* each aspect has its own RNG stream (``turns``, ``role``, ``user``, ``tool``, ``output``, ``think``,
  ``text``), so changing one knob leaves the draws of the others as they were;
* the system prompt comes from (seed, tenant) only: every session of a tenant sends the same text;
* texts come from :func:`workloads.tokenizer.synthetic_text`, so a turn built for N tokens is exactly
  N tokens to the shared tokenizer.

Turn 0 is a user message (``first_user_tokens``) with no think time. Each follow-up is a tool result
with probability ``tool_turn_fraction`` (``tool_output_tokens``, waiting ``tool_time`` first) and
otherwise a user message (``user_tokens``, waiting ``think_time``). With ``cold_prefill`` every turn
is marked ``cold``: the runtime puts a unique nonce at the very start of that request's prompt.
"""

from __future__ import annotations

import random
from typing import Any

from workloads.model import Session, Turn
from workloads.spec import TenantSpec, WorkloadSpec
from workloads.tokenizer import synthetic_text
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
            text = system_prompt_text(seed, tenant, int(n))
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
                    content=synthetic_text(max(1, int(n_in)), r_text),
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
        return self.spec.fingerprint()

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "source": self.source,
            "fingerprint": self.fingerprint(),
            "spec": self.spec.to_dict(),
        }
