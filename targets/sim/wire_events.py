"""Bytes on the wire for the two event-stream APIs: Anthropic Messages and OpenAI Responses.

Same contract as ``wire.StreamTemplate`` (one template per request, a token event is a prefix, the
JSON-escaped word and a suffix): ``opening`` goes out with the first token, ``closing`` after the
last one, ``malformed`` is an event cut inside its JSON string. Every SSE event is named
(``event: <type>``) and its data repeats the type, as both APIs do.

Usage follows each API: Messages ``input_tokens`` is the uncached part of the prompt, with
``cache_read_input_tokens`` beside it; Responses ``input_tokens`` is the whole prompt, with
``input_tokens_details.cached_tokens`` inside it.
"""

from __future__ import annotations

import orjson

from targets.sim.wire import WORD_BYTES

MESSAGES = "messages"
RESPONSES = "responses"

_STOP_REASON = {"length": "max_tokens", "stop": "end_turn"}


def _event(kind: str, obj: dict) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"


def messages_usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    return {
        "input_tokens": prompt_tokens - cached_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached_tokens,
        "output_tokens": completion_tokens,
    }


def responses_usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    return {
        "input_tokens": prompt_tokens,
        "input_tokens_details": {"cached_tokens": cached_tokens},
        "output_tokens": completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt_tokens + completion_tokens,
    }


class MessagesTemplate:
    """One ``/v1/messages`` stream: ``message_start``, ``ping``, one text block of
    ``text_delta`` events, ``message_delta`` (stop reason, output tokens), ``message_stop``."""

    __slots__ = ("message_id", "model", "token_prefix")

    token_suffix = b'"}}\n\n'

    def __init__(self, message_id: str, model: str) -> None:
        self.message_id = message_id
        self.model = model
        self.token_prefix = (
            b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
            b'"delta":{"type":"text_delta","text":"'
        )

    def token(self, word: int) -> bytes:
        return self.token_prefix + WORD_BYTES[word] + self.token_suffix

    def text_token(self, text: str) -> bytes:
        return self.token_prefix + orjson.dumps(text)[1:-1] + self.token_suffix

    def opening(self, prompt_tokens: int, cached_tokens: int) -> bytes:
        message = {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": messages_usage(prompt_tokens, 1, cached_tokens),
        }
        return (
            _event("message_start", {"type": "message_start", "message": message})
            + _event("ping", {"type": "ping"})
            + _event(
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            )
        )

    def closing(self, finish: str, prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> bytes:
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": _STOP_REASON.get(finish, finish), "stop_sequence": None},
            "usage": {"output_tokens": completion_tokens},
        }
        return (
            _event("content_block_stop", {"type": "content_block_stop", "index": 0})
            + _event("message_delta", delta)
            + _event("message_stop", {"type": "message_stop"})
        )

    def malformed(self) -> bytes:
        return self.token_prefix + b"\n\n"

    def full(self, text: str, finish: str, prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> bytes:
        """The non-streaming reply: one ``message`` object."""
        return orjson.dumps(
            {
                "id": self.message_id,
                "type": "message",
                "role": "assistant",
                "model": self.model,
                "content": [{"type": "text", "text": text}],
                "stop_reason": _STOP_REASON.get(finish, finish),
                "stop_sequence": None,
                "usage": messages_usage(prompt_tokens, completion_tokens, cached_tokens),
            }
        )


class ResponsesTemplate:
    """One ``/v1/responses`` stream: ``response.created``, ``response.in_progress``, one message
    item with one ``output_text`` part of ``response.output_text.delta`` events, the ``.done``
    events, then ``response.completed`` (or ``response.incomplete`` when ``max_output_tokens``
    ended it) with the usage. Events carry an increasing ``sequence_number``."""

    __slots__ = ("created", "item_id", "model", "pieces", "response_id", "seq", "token_prefix")

    def __init__(self, response_id: str, created: int, model: str) -> None:
        self.response_id = response_id
        self.created = int(created)
        self.model = model
        self.item_id = "msg_" + response_id.removeprefix("resp_")
        self.seq = 0
        self.pieces: list[bytes] = []  # the JSON-escaped text streamed so far
        self.token_prefix = (
            b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","item_id":'
            + orjson.dumps(self.item_id)
            + b',"output_index":0,"content_index":0,"delta":"'
        )

    def _next(self) -> int:
        self.seq += 1
        return self.seq - 1

    def _event(self, kind: str, obj: dict) -> bytes:
        return _event(kind, {"type": kind, **obj, "sequence_number": self._next()})

    def _delta(self, escaped: bytes) -> bytes:
        self.pieces.append(escaped)
        return (
            self.token_prefix
            + escaped
            + b'","logprobs":[],"sequence_number":'
            + str(self._next()).encode()
            + b"}\n\n"
        )

    def token(self, word: int) -> bytes:
        return self._delta(WORD_BYTES[word])

    def text_token(self, text: str) -> bytes:
        return self._delta(orjson.dumps(text)[1:-1])

    def _response(self, status: str, output: list, usage: dict | None, finish: str | None = None) -> dict:
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if finish == "length" else None,
            "model": self.model,
            "output": output,
            "usage": usage,
        }

    def _item(self, text: str, status: str) -> dict:
        content = [{"type": "output_text", "text": text, "annotations": []}] if status else []
        return {"id": self.item_id, "type": "message", "status": status or "in_progress", "role": "assistant", "content": content}

    def opening(self, prompt_tokens: int, cached_tokens: int) -> bytes:
        return (
            self._event("response.created", {"response": self._response("in_progress", [], None)})
            + self._event("response.in_progress", {"response": self._response("in_progress", [], None)})
            + self._event("response.output_item.added", {"output_index": 0, "item": self._item("", "")})
            + self._event(
                "response.content_part.added",
                {
                    "item_id": self.item_id,
                    "output_index": 0,
                    "content_index": 0,
                    "part": {"type": "output_text", "text": "", "annotations": []},
                },
            )
        )

    def closing(self, finish: str, prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> bytes:
        text = orjson.loads(b'"' + b"".join(self.pieces) + b'"')
        where = {"item_id": self.item_id, "output_index": 0, "content_index": 0}
        status = "incomplete" if finish == "length" else "completed"
        item = self._item(text, status)
        usage = responses_usage(prompt_tokens, completion_tokens, cached_tokens)
        return (
            self._event("response.output_text.done", {**where, "text": text, "logprobs": []})
            + self._event(
                "response.content_part.done", {**where, "part": {"type": "output_text", "text": text, "annotations": []}}
            )
            + self._event("response.output_item.done", {"output_index": 0, "item": item})
            + self._event("response." + status, {"response": self._response(status, [item], usage, finish)})
        )

    def malformed(self) -> bytes:
        return self.token_prefix + b"\n\n"

    def full(self, text: str, finish: str, prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> bytes:
        """The non-streaming reply: one ``response`` object."""
        status = "incomplete" if finish == "length" else "completed"
        usage = responses_usage(prompt_tokens, completion_tokens, cached_tokens)
        return orjson.dumps(self._response(status, [self._item(text, status)], usage, finish))


def error_body(endpoint: str, message: str, status: int) -> bytes:
    """The error JSON each API returns with a non-2xx status."""
    if endpoint == MESSAGES:
        kind = {400: "invalid_request_error", 404: "not_found_error", 429: "rate_limit_error", 529: "overloaded_error"}
        return orjson.dumps({"type": "error", "error": {"type": kind.get(status, "api_error"), "message": message}})
    code = {400: "invalid_request_error", 429: "rate_limit_exceeded"}.get(status, "server_error")
    return orjson.dumps({"error": {"message": message, "type": code, "param": None, "code": code}})
