"""What a captured chat request says, reduced to what a session file keeps.

Pure functions over decoded JSON bodies. A message's *text* is its string content, or the text
parts of an OpenAI content-part list joined by newlines (images and audio parts carry no text and
are left out), plus the name and arguments of any tool calls an assistant message carries, so a
folded-in assistant message keeps roughly its size. A message's *digest* identifies it for
history matching: role, text and tool-call fields, not the exact JSON spelling.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

# Leading messages with these roles form the system prompt.
SYSTEM_ROLES = ("system", "developer")
# Joins several new messages into one turn's text: blank lines are no tokens to the tokenizer.
MESSAGE_SEPARATOR = "\n\n"


@dataclass(frozen=True, slots=True)
class Message:
    role: str
    text: str
    digest: bytes
    call_id: str | None = None  # a tool result: the id of the call it answers
    calls: dict[str, str] | None = None  # an assistant message: its tool calls, id -> tool name


def make_message(
    role: str, text: str, *, call_id: Any = None, calls: dict[str, str] | None = None, name: Any = None
) -> Message:
    """A message and its digest (role, text, the call it answers, the sender ``name``); a call id
    that is not a string still tells messages apart but names no call."""
    identity = [role, text, call_id, name]
    digest = hashlib.blake2b(orjson.dumps(identity, default=str), digest_size=16).digest()
    return Message(role, text, digest, call_id if isinstance(call_id, str) else None, calls)


def parse_messages(raw: Any) -> list[Message] | None:
    """The messages of a chat body's ``messages`` list, or None when it is not one."""
    if not isinstance(raw, list) or not raw:
        return None
    out = []
    for m in raw:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            return None
        out.append(_message(m))
    return out


def _message(m: dict) -> Message:
    role = m["role"]
    text = _content_text(m.get("content"))
    calls = m.get("tool_calls")
    names: dict[str, str] = {}
    if isinstance(calls, list) and calls:
        call_texts = []
        for call in calls:
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict):
                call_texts.append(f"{fn.get('name') or ''}({fn.get('arguments') or ''})")
                if isinstance(call.get("id"), str) and isinstance(fn.get("name"), str):
                    names[call["id"]] = fn["name"]
        text = "\n".join(t for t in (text, *call_texts) if t)
    call_id = m.get("tool_call_id")
    return make_message(role, text, call_id=call_id, calls=names or None, name=m.get("name"))


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        return "\n".join(p for p in parts if isinstance(p, str))
    return ""


def prefix_digests(messages: Sequence[Message]) -> list[bytes]:
    """``out[i]`` identifies ``messages[:i + 1]``: a chained hash, so any prefix is one lookup."""
    out = []
    h = b""
    for m in messages:
        h = hashlib.blake2b(h + m.digest, digest_size=16).digest()
        out.append(h)
    return out


def split_system(messages: Sequence[Message]) -> tuple[str, list[Message]]:
    """The leading system/developer messages' text (joined), and the messages after them."""
    i = 0
    while i < len(messages) and messages[i].role in SYSTEM_ROLES:
        i += 1
    return MESSAGE_SEPARATOR.join(m.text for m in messages[:i]), list(messages[i:])


def turn_text(messages: Sequence[Message]) -> tuple[str, str]:
    """One turn from the messages a request adds: (content, role).

    Several messages become one turn, their texts joined by a blank line, because a session file
    turn is one request and the replay must send as many requests as the agent did. The role is
    ``tool`` when every message is a tool result, else ``user``.
    """
    role = "tool" if messages and all(m.role == "tool" for m in messages) else "user"
    return MESSAGE_SEPARATOR.join(m.text for m in messages if m.text), role


def answered_tool(added: Sequence[Message], history: Sequence[Message]) -> str | None:
    """The tool a tool-result turn answers: the name of the call its first result names, looked
    up in the assistant messages of ``history`` (latest first); None for other turns, or when
    the call is not in the history (the reply that made it was not resent)."""
    if not added or any(m.role != "tool" for m in added):
        return None
    call_id = added[0].call_id
    if call_id is None:
        return None
    for m in reversed(history):
        if m.calls and call_id in m.calls:
            return m.calls[call_id] or None
    return None
