"""The ``steps`` key of a workload spec: a session as a DAG of steps instead of ``turns`` in a chain.

Keys of one step (docs/workloads.md, "Agent sessions as DAGs")::

    steps:
      - {id: plan, kind: request}                         # a user message (first_user_tokens first)
      - {id: read, kind: fan_out, k: {dist: uniform, low: 2, high: 8},
         tool: read_file, join_as: tool, input_tokens: 300, output_tokens: 96}
      - {id: edit, kind: request, repeat: {dist: uniform, low: 1, high: 3}}
      - {id: test, kind: tool, tool: run_tests, after: edit}

``kind`` is ``request`` (a user message, after ``think_time``), ``tool`` (the result of a call to
``tool`` that the previous reply made, after ``tool_time``) or ``fan_out`` (``k`` concurrent children,
each the parent's context plus its own message; the request step after it joins them, and their
outputs go back as results of ``tool`` calls, or as assistant content with ``join_as: assistant``). ``after`` names the step
this one follows (default: the one listed before it); the steps must form one chain from the first.
``repeat`` runs a request or tool step several times in a row. ``input_tokens``, ``output_tokens``,
``think_time`` and ``tool_time`` override the spec's knobs for that step.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from workloads.distributions import Distribution, parse_distribution
from workloads.errors import WorkloadError

STEP_REQUEST = "request"
STEP_TOOL = "tool"
STEP_FAN_OUT = "fan_out"
SPEC_STEP_KINDS = (STEP_REQUEST, STEP_TOOL, STEP_FAN_OUT)
JOIN_AS = ("tool", "assistant")
DEFAULT_FAN_OUT_TOOL = "subtask"

STEP_KEYS = (
    "id", "kind", "after", "repeat", "k", "tool", "join_as",
    "input_tokens", "output_tokens", "think_time", "tool_time",
)  # fmt: skip
# key -> (integer, duration, at_least)
_DIST_KEYS: dict[str, tuple[bool, bool, int]] = {
    "repeat": (True, False, 1),
    "k": (True, False, 1),
    "input_tokens": (True, False, 1),
    "output_tokens": (True, False, 1),
    "think_time": (False, True, 0),
    "tool_time": (False, True, 0),
}


@dataclass(frozen=True, slots=True)
class StepSpec:
    """One validated step template; distributions left unset fall back to the spec's knobs."""

    step_id: str
    kind: str
    repeat: Distribution | None = None
    k: Distribution | None = None
    tool: str | None = None
    join_as: str = "tool"
    input_tokens: Distribution | None = None
    output_tokens: Distribution | None = None
    think_time: Distribution | None = None
    tool_time: Distribution | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.step_id, "kind": self.kind}
        for key in ("repeat", "k", "input_tokens", "output_tokens", "think_time", "tool_time"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value.to_dict()
        if self.tool is not None:
            out["tool"] = self.tool
        if self.kind == STEP_FAN_OUT:
            out["join_as"] = self.join_as
        return out


def parse_steps(raw: Any, *, where: str) -> tuple[StepSpec, ...]:
    """Validate the ``steps`` list and return the steps in execution order (``after`` resolved)."""
    at = f"{where}: steps"
    if not isinstance(raw, list) or not raw:
        raise WorkloadError(f"{at}: {raw!r} is not a list of steps; use a non-empty list of {{id, kind}} mappings")
    parsed: list[StepSpec] = []
    after: dict[str, str | None] = {}
    for i, item in enumerate(raw):
        step, follows = _parse_step(item, i, where=where)
        if step.step_id in after:
            raise WorkloadError(f"{at}[{i}].id: {step.step_id!r} is used twice; give every step a unique id")
        after[step.step_id] = follows if follows is not None or i == 0 else parsed[-1].step_id
        parsed.append(step)
    order = _chain_order([s.step_id for s in parsed], after, at=at)
    by_id = {s.step_id: s for s in parsed}
    steps = tuple(by_id[sid] for sid in order)
    if steps[0].kind != STEP_REQUEST:
        raise WorkloadError(f"{at}: the first step ({steps[0].step_id!r}) must be a request; a {steps[0].kind} needs a reply before it")
    for prev, cur in itertools.pairwise(steps):
        if prev.kind == STEP_FAN_OUT and cur.kind != STEP_REQUEST:
            raise WorkloadError(
                f"{at}: {cur.step_id!r} (a {cur.kind}) follows the fan_out {prev.step_id!r}; a fan_out is joined "
                "by a request step"
            )
    return steps


def _parse_step(item: Any, i: int, *, where: str) -> tuple[StepSpec, str | None]:
    at = f"{where}: steps[{i}]"
    if not isinstance(item, Mapping):
        raise WorkloadError(f"{at}: {item!r} is not a mapping; use {{id: ..., kind: request|tool|fan_out}}")
    for key in item:
        if key not in STEP_KEYS:
            raise WorkloadError(f"{at}.{key}: unknown key; use one of {', '.join(STEP_KEYS)}")
    sid = item.get("id")
    if not isinstance(sid, str) or not sid.strip() or any(c in sid for c in " .,:"):
        raise WorkloadError(f"{at}.id: {sid!r} is not an id; use a short name without spaces, dots, commas or colons")
    kind = item.get("kind")
    if kind not in SPEC_STEP_KINDS:
        raise WorkloadError(f"{at}.kind: {kind!r} is not a step kind; use one of {', '.join(SPEC_STEP_KINDS)}")
    follows = item.get("after")
    if follows is not None and not isinstance(follows, str):
        raise WorkloadError(f"{at}.after: {follows!r} is not a step id; name the step this one follows")
    dists: dict[str, Distribution] = {}
    for key, (integer, duration, at_least) in _DIST_KEYS.items():
        if key in item:
            dists[key] = parse_distribution(
                item[key], where=f"{at}.{key}", integer=integer, duration=duration, at_least=at_least
            )
    _check_at_least_one(dists.get("k"), item.get("k"), where=f"{at}.k")
    _check_at_least_one(dists.get("repeat"), item.get("repeat"), where=f"{at}.repeat")
    if kind == STEP_FAN_OUT:
        if "k" not in dists:
            raise WorkloadError(f"{at}.k: missing; a fan_out needs k, the number of children (>= 1)")
        if "repeat" in dists:
            raise WorkloadError(f"{at}.repeat: not allowed on a fan_out; list another fan_out after a join instead")
    elif "k" in dists or "join_as" in item:
        key = "k" if "k" in dists else "join_as"
        raise WorkloadError(f"{at}.{key}: only a fan_out takes {key}; remove it or use kind: fan_out")
    tool = item.get("tool")
    if tool is not None and (not isinstance(tool, str) or not tool.strip()):
        raise WorkloadError(f"{at}.tool: {tool!r} is not a tool name; use a function name such as read_file")
    if kind == STEP_TOOL and tool is None:
        raise WorkloadError(f"{at}.tool: missing; a tool step names the tool whose result it sends")
    if kind == STEP_REQUEST and tool is not None:
        raise WorkloadError(f"{at}.tool: a request step sends a user message; use kind: tool for a tool result")
    join_as = item.get("join_as", "tool")
    if join_as not in JOIN_AS:
        raise WorkloadError(f"{at}.join_as: {join_as!r} is not allowed; use one of {', '.join(JOIN_AS)}")
    if kind == STEP_FAN_OUT and join_as == "tool" and tool is None:
        tool = DEFAULT_FAN_OUT_TOOL
    step = StepSpec(
        step_id=sid,
        kind=kind,
        repeat=dists.get("repeat"),
        k=dists.get("k"),
        tool=tool,
        join_as=join_as,
        input_tokens=dists.get("input_tokens"),
        output_tokens=dists.get("output_tokens"),
        think_time=dists.get("think_time"),
        tool_time=dists.get("tool_time"),
    )
    return step, follows


def _check_at_least_one(dist: Distribution | None, raw: Any, *, where: str) -> None:
    """k and repeat below 1 are errors, not silently clamped: a uniform low or a min under 1."""
    if dist is None:
        return
    low = dist.param("low") if dist.kind == "uniform" else dist.min
    if low is not None and low < 1:
        raise WorkloadError(f"{where}: {raw!r} allows values below 1; use values >= 1")


def _chain_order(ids: list[str], after: dict[str, str | None], *, at: str) -> list[str]:
    """The steps from the one that follows nothing, each followed by the one after it."""
    for sid, prev in after.items():
        if prev is not None and prev not in after:
            raise WorkloadError(f"{at}: {sid!r} is after {prev!r}, which is not a step; name a step id")
        if prev == sid:
            raise WorkloadError(f"{at}: steps form a cycle ({sid} -> {sid}); a session's steps must be acyclic")
    next_of: dict[str, str] = {}
    for sid in ids:
        prev = after[sid]
        if prev is None:
            continue
        if prev in next_of:
            raise WorkloadError(
                f"{at}: {next_of[prev]!r} and {sid!r} both follow {prev!r}; steps form one chain "
                "(use a fan_out for concurrent work)"
            )
        next_of[prev] = sid
    roots = [sid for sid in ids if after[sid] is None]
    order: list[str] = []
    seen: set[str] = set()
    cur: str | None = roots[0] if roots else None
    while cur is not None and cur not in seen:
        seen.add(cur)
        order.append(cur)
        cur = next_of.get(cur)
    if len(order) < len(ids):
        cycle = _cycle_among([sid for sid in ids if sid not in seen], after)
        raise WorkloadError(f"{at}: steps form a cycle ({' -> '.join(cycle)}); a session's steps must be acyclic")
    return order


def _cycle_among(left: list[str], after: dict[str, str | None]) -> list[str]:
    """A cycle among steps not reachable from the first (each has exactly one ``after``)."""
    path: list[str] = []
    cur: str | None = left[0]
    while cur is not None and cur not in path:
        path.append(cur)
        cur = after[cur]
    if cur is None:  # pragma: no cover - every unreachable step sits on or behind a cycle
        return path
    loop = path[path.index(cur) :]
    return [*reversed(loop), loop[-1]]
