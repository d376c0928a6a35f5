"""The session/turn model: what one agent conversation sends.

A ``Session`` is immutable and fully determined by (workload spec, seed, session index), so the
same seed gives the same sessions whatever the number of workers; that is what makes A/B runs
paired.
"""

from __future__ import annotations

from dataclasses import dataclass, field

TURN_CLASS_FIRST = "first"
TURN_CLASS_FOLLOW_UP = "follow-up"


@dataclass(frozen=True, slots=True)
class Turn:
    """One request of a session.

    ``content`` is the new user message or tool result sent on this turn; the request carries the
    system prompt, the whole history (with the assistant replies the server actually streamed)
    and then this. ``think_time_s`` is the wait after the previous turn ended before this one is
    sent (0 for the first turn). ``role`` is ``"user"`` or ``"tool"`` (tool output is sent as a
    user message, since OpenAI-style servers reject a tool message without a preceding tool call).
    """

    content: str
    max_tokens: int
    think_time_s: float = 0.0
    role: str = "user"
    cold: bool = False


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
