"""Bytes on the wire for the two event-stream APIs: Anthropic Messages and OpenAI Responses.

Same contract as ``wire.StreamTemplate`` (one template per request, a token event is a prefix, the
JSON-escaped word and a suffix): ``opening`` goes out with the first token, ``closing`` after the
last one, ``malformed`` is an event cut inside its JSON string. Every SSE event is named
(``event: <type>``) and its data repeats the type, as both APIs do.

A reply that opens with ``reasoning_tokens`` r > 0 streams them first, one ``reasoning_token()``
each, in its own block (Messages: a ``thinking`` content block of ``thinking_delta`` events at
index 0; Responses: a ``reasoning`` output item of ``response.reasoning_text.delta`` events at
output index 0); ``answer_start()`` closes that block and opens the answer's (index 1).

A reply that is a tool call (``tool``, ``targets/sim/tool_calls.py``) streams its answer tokens
with ``tool_token()`` as the call's arguments: Messages, a ``tool_use`` block of
``input_json_delta`` events and ``stop_reason: tool_use``; Responses, a ``function_call`` item of
``response.function_call_arguments.delta`` events, then ``response.function_call_arguments.done``.

Usage follows each API: Messages ``input_tokens`` is the uncached part of the prompt, with
``cache_read_input_tokens`` beside it; Responses ``input_tokens`` is the whole prompt, with
``input_tokens_details.cached_tokens`` inside it.
"""

from __future__ import annotations

import orjson

from targets.sim.tool_calls import argument_piece
from targets.sim.wire import REASONING_WORD, WORD_BYTES, WORDS_SPACED, call_id_of

MESSAGES = "messages"
RESPONSES = "responses"

_STOP_REASON = {"length": "max_tokens", "stop": "end_turn"}
_TOOL_STOP_REASON = {"length": "max_tokens", "stop": "tool_use"}
_REASONING_TEXT = " " + REASONING_WORD.decode()
# What a thinking block is signed with: the API's signature is opaque to clients, so any string does.
_SIGNATURE = "loadgen-sim"


def _event(kind: str, obj: dict) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"


def messages_usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    return {
        "input_tokens": prompt_tokens - cached_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached_tokens,
        "output_tokens": completion_tokens,
    }


def responses_usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int, reasoning_tokens: int = 0) -> dict:
    return {
        "input_tokens": prompt_tokens,
        "input_tokens_details": {"cached_tokens": cached_tokens},
        "output_tokens": completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": prompt_tokens + completion_tokens,
    }


class MessagesTemplate:
    """One ``/v1/messages`` stream: ``message_start``, ``ping``, a ``thinking`` block of
    ``thinking_delta`` events when the reply reasons, one text block of ``text_delta`` events,
    ``message_delta`` (stop reason, output tokens), ``message_stop``."""

    __slots__ = (
        "message_id", "model", "reasoning_chunk", "reasoning_tokens", "text_index", "token_prefix", "tool",
        "tool_left", "tool_prefix", "tool_started",
    )  # fmt: skip

    token_suffix = b'"}}\n\n'

    def __init__(
        self, message_id: str, model: str, reasoning_tokens: int = 0, tool: str | None = None, answer_tokens: int = 0
    ) -> None:
        self.message_id = message_id
        self.model = model
        self.reasoning_tokens = reasoning_tokens
        self.text_index = 1 if reasoning_tokens else 0
        self.tool = tool
        self.tool_left = answer_tokens
        self.tool_started = False
        self.tool_prefix = (
            b'event: content_block_delta\ndata: {"type":"content_block_delta","index":'
            + str(self.text_index).encode()
            + b',"delta":{"type":"input_json_delta","partial_json":"'
        )
        self.token_prefix = (
            b'event: content_block_delta\ndata: {"type":"content_block_delta","index":'
            + str(self.text_index).encode()
            + b',"delta":{"type":"text_delta","text":"'
        )
        self.reasoning_chunk = (
            b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
            b'"delta":{"type":"thinking_delta","thinking":" ' + REASONING_WORD + self.token_suffix
        )

    def token(self, word: int) -> bytes:
        return self.token_prefix + WORD_BYTES[word] + self.token_suffix

    def text_token(self, text: str) -> bytes:
        return self.token_prefix + orjson.dumps(text)[1:-1] + self.token_suffix

    def reasoning_token(self) -> bytes:
        """One thinking token (the thinking block is open)."""
        return self.reasoning_chunk

    def tool_token(self, word: int) -> bytes:
        """The next answer token as a piece of the ``tool_use`` block's input JSON."""
        first, self.tool_started = not self.tool_started, True
        self.tool_left -= 1
        piece = argument_piece(WORDS_SPACED[word], first, self.tool_left <= 0)
        return self.tool_prefix + orjson.dumps(piece)[1:-1] + self.token_suffix

    def _answer_block(self) -> dict:
        if self.tool:
            return {"type": "tool_use", "id": self.tool_use_id, "name": self.tool, "input": {}}
        return {"type": "text", "text": ""}

    @property
    def tool_use_id(self) -> str:
        return "toolu_" + call_id_of(self.message_id).removeprefix("call_")

    def _stop_reason(self, finish: str) -> str:
        return (_TOOL_STOP_REASON if self.tool else _STOP_REASON).get(finish, finish)

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
        block = {"type": "thinking", "thinking": "", "signature": ""} if self.reasoning_tokens else self._answer_block()
        return (
            _event("message_start", {"type": "message_start", "message": message})
            + _event("ping", {"type": "ping"})
            + _event("content_block_start", {"type": "content_block_start", "index": 0, "content_block": block})
        )

    def answer_start(self) -> bytes:
        """After the last thinking token: sign and close the thinking block, open the text block."""
        return (
            _event(
                "content_block_delta",
                {"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": _SIGNATURE}},
            )
            + _event("content_block_stop", {"type": "content_block_stop", "index": 0})
            + _event(
                "content_block_start",
                {"type": "content_block_start", "index": 1, "content_block": self._answer_block()},
            )
        )

    def closing(self, finish: str, prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> bytes:
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": self._stop_reason(finish), "stop_sequence": None},
            "usage": {"output_tokens": completion_tokens},
        }
        return (
            _event("content_block_stop", {"type": "content_block_stop", "index": self.text_index})
            + _event("message_delta", delta)
            + _event("message_stop", {"type": "message_stop"})
        )

    def malformed(self) -> bytes:
        return self.token_prefix + b"\n\n"

    def full(self, text: str, finish: str, prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> bytes:
        """The non-streaming reply: one ``message`` object (a thinking block first when it reasons);
        a tool call's ``text`` is its input JSON."""
        content: list[dict] = [{"type": "text", "text": text}]
        if self.tool:
            content = [{**self._answer_block(), "input": orjson.loads(text)}]
        if self.reasoning_tokens:
            thinking = _REASONING_TEXT * self.reasoning_tokens
            content.insert(0, {"type": "thinking", "thinking": thinking, "signature": _SIGNATURE})
        return orjson.dumps(
            {
                "id": self.message_id,
                "type": "message",
                "role": "assistant",
                "model": self.model,
                "content": content,
                "stop_reason": self._stop_reason(finish),
                "stop_sequence": None,
                "usage": messages_usage(prompt_tokens, completion_tokens, cached_tokens),
            }
        )


class ResponsesTemplate:
    """One ``/v1/responses`` stream: ``response.created``, ``response.in_progress``, a
    ``reasoning`` item of ``response.reasoning_text.delta`` events when the reply reasons, one
    message item with one ``output_text`` part of ``response.output_text.delta`` events, the
    ``.done`` events, then ``response.completed`` (or ``response.incomplete`` when
    ``max_output_tokens`` ended it) with the usage. Events carry an increasing ``sequence_number``."""

    __slots__ = (
        "created", "item_id", "model", "out_index", "pieces", "reasoning_id", "reasoning_prefix",
        "reasoning_tokens", "response_id", "seq", "token_prefix", "tool", "tool_left", "tool_prefix",
    )  # fmt: skip

    def __init__(
        self,
        response_id: str,
        created: int,
        model: str,
        reasoning_tokens: int = 0,
        tool: str | None = None,
        answer_tokens: int = 0,
    ) -> None:
        self.response_id = response_id
        self.created = int(created)
        self.model = model
        self.reasoning_tokens = reasoning_tokens
        self.tool = tool
        self.tool_left = answer_tokens
        rid = response_id.removeprefix("resp_")
        self.item_id = ("fc_" if tool else "msg_") + rid
        self.reasoning_id = "rs_" + rid
        self.out_index = 1 if reasoning_tokens else 0  # the message item's output_index
        self.seq = 0
        self.pieces: list[bytes] = []  # the JSON-escaped text streamed so far
        self.token_prefix = (
            b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","item_id":'
            + orjson.dumps(self.item_id)
            + b',"output_index":'
            + str(self.out_index).encode()
            + b',"content_index":0,"delta":"'
        )
        self.tool_prefix = (
            b'event: response.function_call_arguments.delta\ndata: {"type":"response.function_call_arguments.delta",'
            b'"item_id":' + orjson.dumps(self.item_id) + b',"output_index":' + str(self.out_index).encode() + b',"delta":"'
        )
        self.reasoning_prefix = (
            b'event: response.reasoning_text.delta\ndata: {"type":"response.reasoning_text.delta","item_id":'
            + orjson.dumps(self.reasoning_id)
            + b',"output_index":0,"content_index":0,"delta":" '
            + REASONING_WORD
            + b'","sequence_number":'
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

    def tool_token(self, word: int) -> bytes:
        """The next answer token as a piece of the ``function_call`` item's arguments."""
        first = not self.pieces
        self.tool_left -= 1
        escaped = orjson.dumps(argument_piece(WORDS_SPACED[word], first, self.tool_left <= 0))[1:-1]
        self.pieces.append(escaped)
        return self.tool_prefix + escaped + b'","sequence_number":' + str(self._next()).encode() + b"}\n\n"

    def reasoning_token(self) -> bytes:
        """One reasoning token (the reasoning item is open)."""
        return self.reasoning_prefix + str(self._next()).encode() + b"}\n\n"

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
        if self.tool:  # text: the call's arguments
            return {
                "id": self.item_id, "type": "function_call", "status": status or "in_progress",
                "arguments": text, "call_id": call_id_of(self.response_id), "name": self.tool,
            }  # fmt: skip
        content = [{"type": "output_text", "text": text, "annotations": []}] if status else []
        return {"id": self.item_id, "type": "message", "status": status or "in_progress", "role": "assistant", "content": content}

    def _reasoning_item(self, done: bool) -> dict:
        content = [{"type": "reasoning_text", "text": _REASONING_TEXT * self.reasoning_tokens}] if done else []
        status = "completed" if done else "in_progress"
        return {"id": self.reasoning_id, "type": "reasoning", "status": status, "summary": [], "content": content}

    def _message_opening(self) -> bytes:
        added = self._event("response.output_item.added", {"output_index": self.out_index, "item": self._item("", "")})
        if self.tool:  # a function_call item has no content parts
            return added
        return added + self._event(
            "response.content_part.added",
            {
                "item_id": self.item_id,
                "output_index": self.out_index,
                "content_index": 0,
                "part": {"type": "output_text", "text": "", "annotations": []},
            },
        )

    def opening(self, prompt_tokens: int, cached_tokens: int) -> bytes:
        head = self._event("response.created", {"response": self._response("in_progress", [], None)}) + self._event(
            "response.in_progress", {"response": self._response("in_progress", [], None)}
        )
        if self.reasoning_tokens:
            return head + self._event(
                "response.output_item.added", {"output_index": 0, "item": self._reasoning_item(False)}
            )
        return head + self._message_opening()

    def answer_start(self) -> bytes:
        """After the last reasoning token: finish the reasoning item, open the message item."""
        where = {"item_id": self.reasoning_id, "output_index": 0, "content_index": 0}
        return (
            self._event("response.reasoning_text.done", {**where, "text": _REASONING_TEXT * self.reasoning_tokens})
            + self._event("response.output_item.done", {"output_index": 0, "item": self._reasoning_item(True)})
            + self._message_opening()
        )

    def _output(self, text: str, status: str) -> list[dict]:
        item = self._item(text, status)
        return [self._reasoning_item(True), item] if self.reasoning_tokens else [item]

    def closing(self, finish: str, prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> bytes:
        text = orjson.loads(b'"' + b"".join(self.pieces) + b'"')
        where = {"item_id": self.item_id, "output_index": self.out_index, "content_index": 0}
        status = "incomplete" if finish == "length" else "completed"
        item = self._item(text, status)
        usage = responses_usage(prompt_tokens, completion_tokens, cached_tokens, self.reasoning_tokens)
        if self.tool:
            done = {"item_id": self.item_id, "output_index": self.out_index, "name": self.tool, "arguments": text}
            return (
                self._event("response.function_call_arguments.done", done)
                + self._event("response.output_item.done", {"output_index": self.out_index, "item": item})
                + self._event(
                    "response." + status, {"response": self._response(status, self._output(text, status), usage, finish)}
                )
            )
        return (
            self._event("response.output_text.done", {**where, "text": text, "logprobs": []})
            + self._event(
                "response.content_part.done", {**where, "part": {"type": "output_text", "text": text, "annotations": []}}
            )
            + self._event("response.output_item.done", {"output_index": self.out_index, "item": item})
            + self._event("response." + status, {"response": self._response(status, self._output(text, status), usage, finish)})
        )

    def malformed(self) -> bytes:
        return self.token_prefix + b"\n\n"

    def full(self, text: str, finish: str, prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> bytes:
        """The non-streaming reply: one ``response`` object (a reasoning item first when it reasons)."""
        status = "incomplete" if finish == "length" else "completed"
        usage = responses_usage(prompt_tokens, completion_tokens, cached_tokens, self.reasoning_tokens)
        return orjson.dumps(self._response(status, self._output(text, status), usage, finish))


def error_body(endpoint: str, message: str, status: int) -> bytes:
    """The error JSON each API returns with a non-2xx status."""
    if endpoint == MESSAGES:
        kind = {400: "invalid_request_error", 404: "not_found_error", 429: "rate_limit_error", 529: "overloaded_error"}
        return orjson.dumps({"type": "error", "error": {"type": kind.get(status, "api_error"), "message": message}})
    code = {400: "invalid_request_error", 429: "rate_limit_exceeded"}.get(status, "server_error")
    return orjson.dumps({"error": {"message": message, "type": code, "param": None, "code": code}})
