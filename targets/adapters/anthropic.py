"""The Anthropic Messages API: ``POST /v1/messages`` with ``stream: true``.

Request: the conversation loadgen builds (OpenAI-shaped ``system``/``user``/``assistant``/``tool``
messages, assistant ``tool_calls``) in the Messages shape: system messages join into the top-level
``system``; an assistant message becomes ``text`` plus ``tool_use`` blocks (``input`` is the call's
decoded ``arguments``); ``tool`` messages become ``tool_result`` blocks in a user turn; turns of
the same role merge, so user and assistant alternate. ``max_tokens`` is required. OpenAI ``tools``
definitions (``extra_body={"tools": ...}``) become ``{name, description, input_schema}``. The
session id travels in the session header and in ``metadata.user_id``. Auth: ``x-api-key`` plus
``anthropic-version: 2023-06-01``.

Stream (named SSE events; each ``data:`` object repeats its ``type``, which is what is read):

* ``message_start``: ``message.usage`` holds ``input_tokens`` (the uncached part of the prompt),
  ``cache_read_input_tokens`` and ``cache_creation_input_tokens``;
* ``content_block_start`` / ``content_block_stop``: carry no token;
* ``content_block_delta``: ``text_delta`` (reply text), ``thinking_delta`` (thinking: generated
  tokens, not reply text: ``StreamEvent.reasoning``) and ``input_json_delta`` (tool-call arguments) are token-bearing, one
  token per delta; ``signature_delta`` and ``citations_delta`` are not;
* ``message_delta``: ``usage.output_tokens`` (cumulative) and ``delta.stop_reason``;
* ``message_stop``: the end of the stream; ``ping``: keep-alive;
* ``error``: ``{"type": "error", "error": {"type": "overloaded_error", "message": ...}}``, mapped to
  the HTTP status the API gives that type (``ERROR_STATUS``).

Usage: ``prompt_tokens = input_tokens + cache_read_input_tokens + cache_creation_input_tokens``,
``cached_tokens = cache_read_input_tokens``, ``completion_tokens = output_tokens``.
"""

from __future__ import annotations

from typing import Any

import orjson

from workloads.tokenizer import count_tokens

from .base import (
    Adapter,
    BadChunk,
    ChatRequest,
    PreparedRequest,
    StreamEvent,
    Usage,
    build_headers,
    content_text,
    count_or_none,
    load_json,
    sse_payload,
    text_or_empty,
)

__all__ = ["ANTHROPIC_VERSION", "ERROR_STATUS", "AnthropicMessagesAdapter", "to_messages"]

ANTHROPIC_VERSION = "2023-06-01"

# The HTTP status the Messages API returns for each error type (also the code of a stream error).
ERROR_STATUS: dict[str, int] = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}


class AnthropicMessagesAdapter(Adapter):
    """Options: ``temperature`` (sent when set); ``ignore_eos`` (default False: the Anthropic
    service rejects unknown fields; engines with a Messages endpoint that take it may enable it)."""

    name = "anthropic-messages"
    path = "/v1/messages"
    accepts_tools = True

    def __init__(self, *, temperature: float | None = None, ignore_eos: bool = False) -> None:
        self.temperature = temperature
        self.ignore_eos = ignore_eos

    @staticmethod
    def auth_headers(api_key: str | None) -> dict[str, str]:
        """``x-api-key`` with the key; ``anthropic-version`` always."""
        headers = {"anthropic-version": ANTHROPIC_VERSION}
        if api_key:
            headers["x-api-key"] = api_key
        return headers

    def build_request(self, req: ChatRequest) -> PreparedRequest:
        system, messages = to_messages(req.messages)
        body: dict[str, Any] = {}
        if req.model is not None:
            body["model"] = req.model
        body["max_tokens"] = req.max_tokens
        if system:
            body["system"] = system
        body["messages"] = messages
        body["stream"] = req.stream
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if self.ignore_eos and req.ignore_eos:
            body["ignore_eos"] = True
        body["metadata"] = {"user_id": req.session_id}
        extra = dict(req.extra_body) if req.extra_body else {}
        tools = extra.pop("tools", None)
        if tools:
            body["tools"] = [_tool(t) for t in tools]
        body.update(extra)
        headers = build_headers(req, stream=req.stream)
        headers.setdefault("anthropic-version", ANTHROPIC_VERSION)
        return PreparedRequest("POST", self.path, headers, orjson.dumps(body), req.stream)

    def new_stream(self) -> _MessagesStream:
        return _MessagesStream()

    def parse_response(self, body: bytes) -> StreamEvent:
        obj = load_json(body)
        if obj.get("type") == "error" or "error" in obj:
            return _error(obj)
        content = obj.get("content") or []
        if type(content) is not list:
            raise BadChunk("content is not a list in a Messages reply")
        text = "".join(
            text_or_empty(b.get("text")) for b in content if type(b) is dict and b.get("type") == "text"
        )
        thinking = "".join(
            text_or_empty(b.get("thinking")) for b in content if type(b) is dict and b.get("type") == "thinking"
        )
        generated = bool(text) or any(type(b) is dict and b.get("type") in ("thinking", "tool_use") for b in content)
        u = obj.get("usage")
        usage = _usage(u, u) if type(u) is dict else None
        if thinking:
            # The API reports no reasoning count (thinking is billed inside output_tokens): the
            # thinking text's tokens by the shared tokenizer, as the stream counts its deltas.
            usage = usage or Usage()
            usage.reasoning_tokens = count_tokens(thinking)
        tokens = usage.completion_tokens if usage and usage.completion_tokens is not None else int(generated)
        return StreamEvent(tokens=tokens, text=text, usage=usage, done=True)


def _tool(t: Any) -> Any:
    """An OpenAI function tool as a Messages tool; anything else is passed as given."""
    fn = t.get("function") if type(t) is dict and t.get("type") == "function" else None
    if type(fn) is not dict:
        return t
    out = {"name": fn.get("name")}
    if fn.get("description"):
        out["description"] = fn["description"]
    out["input_schema"] = fn.get("parameters") or {"type": "object", "properties": {}}
    return out


def _arguments(raw: Any) -> Any:
    if type(raw) is not str:
        return raw if type(raw) is dict else {}
    try:
        value = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError:
        return {"arguments": raw}
    return value if type(value) is dict else {"value": value}


def to_messages(messages: list[dict]) -> tuple[str, list[dict]]:
    """OpenAI-shaped chat messages as ``(system, messages)`` of the Messages API (module docstring).

    A message whose content is one text block is sent with string content.
    """
    system: list[str] = []
    turns: list[tuple[str, list[dict]]] = []
    for m in messages:
        role = m.get("role")
        content = content_text(m.get("content"))
        if role in ("system", "developer"):
            if content:
                system.append(content)
            continue
        blocks: list[dict] = []
        if role == "tool":
            role = "user"
            blocks.append({"type": "tool_result", "tool_use_id": m.get("tool_call_id") or "", "content": content})
        elif role == "assistant":
            if content:
                blocks.append({"type": "text", "text": content})
            for call in m.get("tool_calls") or ():
                fn = call.get("function") or {}
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": call.get("id") or "",
                        "name": fn.get("name") or "",
                        "input": _arguments(fn.get("arguments")),
                    }
                )
        else:
            role = "user"
            if content:
                blocks.append({"type": "text", "text": content})
        if not blocks:
            continue  # the API refuses empty content; the neighbours merge instead
        if turns and turns[-1][0] == role:
            turns[-1][1].extend(blocks)
        else:
            turns.append((role, blocks))
    out = []
    for role, blocks in turns:
        if role == "user":  # tool results lead their user turn
            blocks.sort(key=lambda b: b["type"] != "tool_result")
        if len(blocks) == 1 and blocks[0]["type"] == "text":
            out.append({"role": role, "content": blocks[0]["text"]})
        else:
            out.append({"role": role, "content": blocks})
    return "\n\n".join(system), out


def _code(err_type: Any) -> int | None:
    return ERROR_STATUS.get(err_type) if type(err_type) is str else None


def _error(obj: dict) -> StreamEvent:
    """An ``error`` event or error body: ``{"type": "error", "error": {"type", "message"}}``."""
    err = obj.get("error")
    if type(err) is dict:
        err_type = err.get("type")
        if type(err_type) is not str:  # a type that is not a string names nothing
            err_type = None
        message = str(err.get("message") or err_type or "error")
    else:
        err_type, message = None, str(err or "error")
    if err_type and err_type not in message:
        message = f"{err_type}: {message}"
    return StreamEvent(error=" ".join(message.split())[:300], error_code=_code(err_type))


def _usage(start: dict, last: dict) -> Usage:
    """Usage from the prompt counts of ``start`` and the output count of ``last``."""
    uncached = count_or_none(start.get("input_tokens"))
    read = count_or_none(start.get("cache_read_input_tokens"))
    created = count_or_none(start.get("cache_creation_input_tokens"))
    prompt = None if uncached is None else uncached + (read or 0) + (created or 0)
    return Usage(prompt, count_or_none(last.get("output_tokens")), read)


_NOTHING = frozenset(("content_block_start", "content_block_stop", "ping"))
_TOKEN_DELTAS = {"thinking_delta": "thinking", "input_json_delta": "partial_json"}
_THINKING = StreamEvent(tokens=1, reasoning=True)  # never mutated by the client: shared


class _MessagesStream:
    """One Messages stream: the prompt counts ``message_start`` gave, for the final usage."""

    __slots__ = ("start",)
    # loadgen/engine/_chat.c (read_messages) applies this parse_line, in C, to the delta events and
    # those that carry nothing, and hands it the rest; a subclass that changes it must not inherit this.
    COMPILED_PATH = "anthropic-messages"

    def __init__(self) -> None:
        self.start: dict = {}

    def parse_line(self, line: bytes) -> StreamEvent | None:
        payload = line[5:].strip() if line.startswith(b"data:") else sse_payload(line)
        if not payload:
            return None
        if payload == b"[DONE]":
            return StreamEvent(done=True)
        obj = load_json(payload)
        kind = obj.get("type")
        if type(kind) is not str:
            if obj.get("error"):  # an error object without the event type
                return _error(obj)
            raise BadChunk("a Messages event without a string type")
        if kind == "content_block_delta":
            delta = obj.get("delta")
            if type(delta) is not dict:
                raise BadChunk("content_block_delta without a delta object")
            dtype = delta.get("type")
            if type(dtype) is not str:
                raise BadChunk("a content_block_delta without a string delta type")
            if dtype == "text_delta":
                text = text_or_empty(delta.get("text"))
                return StreamEvent(tokens=1, text=text) if text else None
            field = _TOKEN_DELTAS.get(dtype)
            if field is not None:
                if not text_or_empty(delta.get(field)):
                    return None
                return _THINKING if dtype == "thinking_delta" else StreamEvent(tokens=1)
            return None  # signature_delta, citations_delta
        if kind in _NOTHING:
            return None
        if kind == "message_start":
            msg = obj.get("message")
            u = msg.get("usage") if type(msg) is dict else None
            if type(u) is not dict:
                return None
            self.start = u
            return StreamEvent(usage=_usage(u, {}))
        if kind == "message_delta":
            u = obj.get("usage")
            if type(u) is not dict:
                return None
            if "input_tokens" in u or "cache_read_input_tokens" in u:
                self.start = {**self.start, **{k: v for k, v in u.items() if v is not None}}
            return StreamEvent(usage=_usage(self.start, u))
        if kind == "message_stop":
            return StreamEvent(done=True)
        if kind == "error" or "error" in obj:
            return _error(obj)
        return None  # event types added later carry nothing loadgen counts
