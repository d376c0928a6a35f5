"""The session/turn model: what one agent conversation sends.

A ``Session`` is immutable and fully determined by (workload spec, seed, session index), so the
same seed gives the same sessions whatever the number of workers; that is what makes A/B runs
paired.

A session is a small DAG of steps (one ``Turn`` = one step = one request), listed in an order
where every step comes after its parents. Without step fields it is a chain: turn k extends turn
k-1. A ``fan-out child`` extends its parent's context with its own message; the children of one
parent run concurrently, and the ``join`` step that follows them waits for the last one and sees
their outputs. A child may be a chain (a branch): a ``follow-up`` that names the child, or the
branch's last step, as its parent extends that branch, and the join waits for each branch's last
step. :mod:`workloads.dag` validates the shape and groups the steps into stages.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from analysis.metric_registry import (
    STEP_KIND_FAN_OUT_CHILD,
    STEP_KIND_JOIN,
    TURN_CLASS_FIRST,
    TURN_CLASS_FOLLOW_UP,
)
from analysis.metric_registry import (
    STEP_KINDS as STEP_KINDS,  # re-exported: the order a DAG's kinds are listed
)

# Step kinds (the results format's, declared in analysis.metric_registry): the first step, a step
# extending one previous step, one of the concurrent children of a fan-out, and the step that
# joins them.
STEP_FIRST = TURN_CLASS_FIRST
STEP_FOLLOW_UP = TURN_CLASS_FOLLOW_UP
STEP_FAN_OUT_CHILD = STEP_KIND_FAN_OUT_CHILD
STEP_JOIN = STEP_KIND_JOIN


@dataclass(frozen=True, slots=True)
class Turn:
    """One request of a session.

    ``content`` is the new user message or tool result sent on this turn; the request carries the
    system prompt, the whole history (with the assistant replies the server actually streamed)
    and then this. ``think_time_s`` is the wait after the previous turn ended before this one is
    sent (0 for the first turn). ``role`` is ``"user"`` or ``"tool"`` (tool output is sent as a
    user message, since OpenAI-style servers reject a tool message without a preceding tool call).

    DAG fields (all optional; the defaults make a chain): ``step_id`` names the step (default
    ``t<index>``); ``kind`` is one of ``STEP_KINDS`` (default: ``first`` for turn 0, else
    ``follow-up``); ``parent_ids`` are the steps it waits for (default: the previous step for a
    follow-up, the last step before the group for a fan-out child, the whole group, or the last
    step of each branch, for a join; a follow-up of a branch names its parent).
    ``tool_call`` names a tool the parent's reply calls (OpenAI ``tool_calls`` format): for a
    follow-up, this turn's ``content`` is the tool's result, sent as a ``tool`` message after
    ``think_time_s`` (the tool's latency); for a fan-out child, the child's *output* goes back
    as the tool's result at the join (a child without ``tool_call`` joins as assistant content).
    """

    content: str
    max_tokens: int
    think_time_s: float = 0.0
    role: str = "user"
    cold: bool = False
    step_id: str = ""
    kind: str = ""
    parent_ids: tuple[str, ...] | None = None
    tool_call: str | None = None


@dataclass(frozen=True, slots=True)
class Session:
    """One agent conversation: a stable id, a tenant, a system prompt and ordered turns."""

    session_id: str
    tenant: str
    system_prompt: str
    turns: tuple[Turn, ...]
    index: int = 0
    meta: dict = field(default_factory=dict, compare=False, hash=False)


def turn_class(turn_index: int) -> str:
    """``"first"`` for turn 0, else ``"follow-up"``: the prefix-cache effect lives in the split."""
    return TURN_CLASS_FIRST if turn_index == 0 else TURN_CLASS_FOLLOW_UP
