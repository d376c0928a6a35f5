"""The state of capture's assembly: the turns recorded, each open conversation, each request on
the wire, and how a request's history is matched against a conversation's (pure functions).

``assembly.SessionAssembler`` keeps these; ``writer`` and ``anonymized`` read the turns.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from loadgen.capture.messages import Message

__all__ = [
    "CaptureStats", "CapturedTurn", "Conversation", "PendingTurn", "added_messages", "added_text",
    "idle_first", "without_reply",
]  # fmt: skip


@dataclass(slots=True)
class CapturedTurn:
    content: str
    role: str
    max_tokens: int
    think_time_s: float
    tool_call: str | None = None  # a tool-result turn: the tool whose call it answers
    kind: str | None = None  # "fan-out child" or "join" (subagents.py); None: a chain step


@dataclass(slots=True)
class Conversation:
    """One open conversation: what it recorded and what its next request must start with."""

    seq: int
    endpoint: str
    key: str | None
    session_id: str | None = None  # given on the first recorded turn
    arrival_s: float | None = None  # when its first recorded turn's request came (monotonic s)
    system_prompt: str = ""
    turns: list[CapturedTurn] = field(default_factory=list)
    # chat: how many messages the last recorded request had, and the digest of that prefix
    history_len: int = 0
    history_digest: bytes | None = None
    # completions: the last recorded prompt and the reply text that followed it
    history_prompt: str | None = None
    last_reply: str = ""
    # responses: the id of the last recorded reply (a chain's next request names it) and the tool
    # calls that reply made (a chained request does not resend them); chained: the history is
    # held by the server, so history_len/history_digest say nothing
    last_response_id: str | None = None
    reply_calls: dict[str, str] | None = None
    chained: bool = False
    tools: tuple[str, ...] = ()  # the tool names its first recorded request defined
    # sub-agents (subagents.py): a parent's, begun since its last turn; a sub-agent's parent
    subagents: list[Conversation] = field(default_factory=list)
    parent: Conversation | None = None
    last_end_s: float | None = None
    last_activity_s: float = 0.0
    in_flight: int = 0
    superseded: bool = False


@dataclass(slots=True)
class PendingTurn:
    """A request on the wire; becomes a turn when its reply completes."""

    conversation: Conversation
    content: str
    role: str
    system_prompt: str
    t_request_s: float
    prev_end_s: float | None
    history_len: int = 0
    history_digest: bytes | None = None
    prompt: str | None = None
    tool_call: str | None = None
    chained: bool = False  # a Responses request that names the previous response
    tools: tuple[str, ...] = ()
    children: list[Conversation] | None = None  # a join: the sub-agents that become its fan-out
    children_tool: str | None = None  # the tool the children's outputs answer

    @property
    def endpoint(self) -> str:
        """The API of the request (``CHAT``, ``COMPLETIONS``, ``MESSAGES``, ``RESPONSES``): what
        its reply is read as (``ReplyMeter(pending.endpoint, ...)``)."""
        return self.conversation.endpoint


@dataclass(slots=True)
class CaptureStats:
    requests: int = 0
    turns: int = 0
    not_recorded: int = 0  # bodies that are not a request of a recorded API we can read
    cut: int = 0
    failed: int = 0
    subagent_requests_folded: int = 0  # a sub-agent's requests before its last (subagents.py)


def idle_first(conv: Conversation) -> tuple[int, float]:
    """Prefer conversations with nothing on the wire, then the one idle the longest."""
    return (conv.in_flight, conv.last_end_s if conv.last_end_s is not None else 0.0)


def added_messages(conv: Conversation, msgs: list[Message], digests: list[bytes]) -> list[Message] | None:
    """What ``msgs`` adds to ``conv``'s history, less the assistant reply; None if it doesn't extend it."""
    n = conv.history_len
    if n == 0 or len(msgs) <= n or digests[n - 1] != conv.history_digest:
        return None
    return without_reply(msgs[n:]) or None


def without_reply(added: list[Message]) -> list[Message]:
    """``added`` less the assistant reply it starts with (the server produced it)."""
    i = 0
    while i < len(added) and added[i].role == "assistant":
        i += 1
    return added[i:]


def added_text(conv: Conversation, prompt: str) -> str | None:
    """What a completions prompt adds after the last recorded prompt and its reply."""
    prev = conv.history_prompt
    if prev is None or len(prompt) <= len(prev) or not prompt.startswith(prev):
        return None
    added = prompt[len(prev) :]
    if conv.last_reply and added.startswith(conv.last_reply):
        added = added[len(conv.last_reply) :]
    return added or None
