"""The recorded APIs: which requests are recorded, and each API's request as chat-shaped messages.

Pure functions over paths and decoded JSON bodies, so they run wherever the assembler runs.

``endpoint_of(method, path)`` names the API of a request the capture records: ``POST`` of
``/v1/chat/completions`` (``CHAT``), ``/v1/completions`` (``COMPLETIONS``), ``/v1/messages``
(``MESSAGES``, Anthropic) or ``/v1/responses`` (``RESPONSES``, OpenAI), under any path prefix.
Everything else is forwarded and not recorded.

The Messages and Responses bodies become the same ``Message`` list a chat body gives
(``messages.parse_messages``), so one history matcher serves all three:

* Messages: ``system`` (a string or text blocks) is one ``system`` message; each ``tool_result``
  block of a user turn is a ``tool`` message (its ``tool_use_id`` is the call it answers), the
  turn's text blocks one ``user`` message after them; an assistant turn is one ``assistant``
  message, its text then one ``name(input)`` line per ``tool_use`` block. ``thinking`` and image
  blocks carry no text.
* Responses: ``instructions`` is one ``system`` message; ``input`` (a string is one user message)
  items: ``message`` items by role (``input_text``/``output_text`` parts), ``function_call`` items
  join the assistant message they follow (``name(arguments)``), each ``function_call_output`` is a
  ``tool`` message; ``reasoning`` and ``item_reference`` items carry no text. ``previous_response_id``
  says which earlier response the input continues.

A body that is not its API's shape gives None: it is forwarded, and counted as not recorded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from loadgen.capture.messages import Message, make_message, parse_messages

CHAT = "chat"
COMPLETIONS = "completions"
MESSAGES = "messages"
RESPONSES = "responses"
ENDPOINTS = (CHAT, COMPLETIONS, MESSAGES, RESPONSES)
# The conversation APIs: their requests carry a message history.
MESSAGE_APIS = (CHAT, MESSAGES, RESPONSES)

_PATH_SUFFIXES = (
    ("/chat/completions", CHAT),
    ("/completions", COMPLETIONS),
    ("/messages", MESSAGES),
    ("/responses", RESPONSES),
)


def endpoint_of(method: str, path: str) -> str | None:
    """Which recorded API a request is (``CHAT``, ``COMPLETIONS``, ``MESSAGES``, ``RESPONSES``), if any."""
    if method != "POST":
        return None
    for suffix, endpoint in _PATH_SUFFIXES:
        if path.endswith(suffix):
            return endpoint
    return None


@dataclass(frozen=True, slots=True)
class ApiRequest:
    """A conversation request reduced to what assembly needs."""

    messages: list[Message]  # system messages first, as the API puts them
    previous_response_id: str | None = None  # Responses: the earlier response this continues
    tools: tuple[str, ...] = ()  # names of the tools the request defines, in order


def read_request(endpoint: str, body: Any) -> ApiRequest | None:
    """The messages of a ``CHAT``, ``MESSAGES`` or ``RESPONSES`` body, or None when it is not one."""
    if not isinstance(body, dict):
        return None
    if endpoint == CHAT:
        msgs = parse_messages(body.get("messages"))
        return None if msgs is None else ApiRequest(msgs, None, _tool_names(body.get("tools"), nested=True))
    if endpoint == MESSAGES:
        msgs = _messages_api(body)
        return None if msgs is None else ApiRequest(msgs, None, _tool_names(body.get("tools"), nested=False))
    if endpoint == RESPONSES:
        msgs = _responses_api(body)
        prev = body.get("previous_response_id")
        if msgs is None or (prev is not None and (not isinstance(prev, str) or not prev)):
            return None
        return ApiRequest(msgs, prev, _tool_names(body.get("tools"), nested=False))
    return None


def _tool_names(raw: Any, *, nested: bool) -> tuple[str, ...]:
    """Tool names: chat nests them in ``function``; Messages and Responses tools hold ``name``."""
    if not isinstance(raw, list):
        return ()
    names = []
    for tool in raw:
        if not isinstance(tool, dict):
            continue
        holder = tool.get("function") if nested else tool
        name = holder.get("name") if isinstance(holder, dict) else None
        if isinstance(name, str):
            names.append(name)
    return tuple(names)


def _block_text(content: Any, text_types: tuple[str, ...]) -> str | None:
    """A string, or the text of the blocks/parts of ``text_types`` joined by newlines; None if neither."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if not isinstance(content, list):
        return None
    parts = []
    for block in content:
        if isinstance(block, dict) and block.get("type") in text_types and isinstance(block.get("text"), str):
            parts.append(block["text"])
    return "\n".join(parts)


def _call_text(name: Any, arguments: Any) -> str:
    args = arguments if isinstance(arguments, str) else orjson.dumps(arguments, default=str).decode()
    return f"{name if isinstance(name, str) else ''}({args})"


# --- Anthropic Messages -------------------------------------------------------------------------------

_MESSAGES_TEXT = ("text",)


def _messages_api(body: dict) -> list[Message] | None:
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        return None
    out: list[Message] = []
    system = _block_text(body.get("system"), _MESSAGES_TEXT)
    if system is None:
        return None
    if system:
        out.append(make_message("system", system))
    for m in raw:
        role = m.get("role") if isinstance(m, dict) else None
        if role not in ("user", "assistant"):
            return None
        content = m.get("content")
        if isinstance(content, str):
            out.append(make_message(role, content))
            continue
        if not isinstance(content, list):
            return None
        texts: list[str] = []
        for block in content:
            if not isinstance(block, dict):
                return None
            kind = block.get("type")
            if kind == "text" and isinstance(block.get("text"), str):
                texts.append(block["text"])
            elif kind == "tool_use" and role == "assistant":
                texts.append(_call_text(block.get("name"), block.get("input") or {}))
            elif kind == "tool_result" and role == "user":
                result = _block_text(block.get("content"), _MESSAGES_TEXT)
                call_id = block.get("tool_use_id")
                out.append(
                    make_message("tool", result or "", call_id=call_id if isinstance(call_id, str) else None)
                )
        if texts or not any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content):
            out.append(
                make_message(
                    role, "\n".join(texts), calls=_tool_uses(content) if role == "assistant" else None
                )
            )
    return out


def _tool_uses(content: list) -> dict[str, str] | None:
    calls = {
        b["id"]: b["name"]
        for b in content
        if isinstance(b, dict) and b.get("type") == "tool_use" and isinstance(b.get("id"), str)
        and isinstance(b.get("name"), str)
    }  # fmt: skip
    return calls or None


# --- OpenAI Responses ---------------------------------------------------------------------------------

_RESPONSES_TEXT = ("input_text", "output_text", "text")
_RESPONSES_ROLES = ("user", "assistant", "system", "developer")


def _responses_api(body: dict) -> list[Message] | None:
    out: list[Message] = []
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        return None
    if instructions:
        out.append(make_message("system", instructions))
    raw = body.get("input")
    if isinstance(raw, str):
        raw = [{"type": "message", "role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        return None
    # An assistant message and the function calls after it are one assistant message, as in chat.
    reply = _Reply()
    for item in raw:
        if not isinstance(item, dict):
            return None
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            text = _block_text(item.get("content"), _RESPONSES_TEXT)
            if role not in _RESPONSES_ROLES or text is None:
                return None
            if role == "assistant":
                if reply.calls:  # text after calls starts another reply
                    reply.end(out)
                reply.texts.append(text)
                continue
            reply.end(out)
            out.append(make_message("system" if role == "developer" else role, text))
        elif kind == "function_call":
            call_id, name = item.get("call_id"), item.get("name")
            reply.texts.append(_call_text(name, item.get("arguments", "")))
            reply.calls[call_id if isinstance(call_id, str) else ""] = name if isinstance(name, str) else ""
        elif kind == "function_call_output":
            reply.end(out)
            output = _block_text(item.get("output"), _RESPONSES_TEXT)
            call_id = item.get("call_id")
            out.append(
                make_message("tool", output or "", call_id=call_id if isinstance(call_id, str) else None)
            )
        # reasoning, item_reference and other items carry no text the prompt needs
    reply.end(out)
    return out or None


class _Reply:
    """The assistant message being gathered from ``message`` and ``function_call`` items."""

    __slots__ = ("calls", "texts")

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.calls: dict[str, str] = {}  # call id -> tool name

    def end(self, out: list[Message]) -> None:
        if self.texts:
            text = "\n".join(t for t in self.texts if t)
            out.append(make_message("assistant", text, calls=dict(self.calls) or None))
        self.texts.clear()
        self.calls.clear()
