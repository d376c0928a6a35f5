"""Bytes on the wire: OpenAI/vLLM-shaped SSE chunks and JSON bodies, pre-encoded for speed.

A stream's chunks differ only in the generated word, so each request builds its chunk prefix once
(``StreamTemplate``) and a token chunk is ``prefix + WORD_BYTES[w] + suffix``: one concatenation,
no dict, no JSON encoder per token. Vocabulary words are plain ASCII letters, so they need no
escaping inside the JSON string.
"""

from __future__ import annotations

import orjson

from targets.sim.text import WORDS
from targets.sim.tool_calls import argument_piece

CHAT = "chat"
COMPLETIONS = "completions"

WORDS_SPACED: tuple[str, ...] = tuple(" " + w for w in WORDS)  # a generated token's text
WORD_BYTES: tuple[bytes, ...] = tuple(w.encode() for w in WORDS_SPACED)
# What every reasoning token says: a word outside the vocabulary (one token to the shared
# tokenizer), so a prompt that holds it holds reasoning sent back.
REASONING_WORD = b"ponder"
DONE = b"data: [DONE]\n\n"

_CHAT_TOKEN_SUFFIX = b'"},"logprobs":null,"finish_reason":null}]}\n\n'
_TOOL_TOKEN_SUFFIX = b'"}}]},"logprobs":null,"finish_reason":null}]}\n\n'
TOOL_CALLS = "tool_calls"  # chat's finish_reason of a reply that ends in a tool call


def call_id_of(reply_id: str) -> str:
    """The id of the tool call a reply makes (one call a reply): ``call_`` and the reply's own id."""
    for prefix in ("chatcmpl-", "msg_", "resp_"):
        if reply_id.startswith(prefix):
            return "call_" + reply_id[len(prefix) :]
    return "call_" + reply_id
_TEXT_TOKEN_SUFFIX = b'","logprobs":null,"finish_reason":null}]}\n\n'


class StreamTemplate:
    """Pre-encoded pieces of one request's SSE stream."""

    __slots__ = (
        "_head", "endpoint", "reasoning_chunk", "token_prefix", "token_suffix", "tool", "tool_first_prefix",
        "tool_left", "tool_prefix", "tool_started",
    )  # fmt: skip

    def __init__(
        self, endpoint: str, completion_id: str, created: int, model: str, tool: str | None = None, answer_tokens: int = 0
    ) -> None:
        """``tool``: the reply's ``answer_tokens`` tokens are the arguments of a call of that tool
        (``tool_token``), streamed as ``delta.tool_calls`` the way vLLM's tool parsers stream them:
        the first delta names the call (index, id, type, function name), later ones add arguments."""
        self.endpoint = endpoint
        self.tool = tool
        self.tool_left = answer_tokens
        self.tool_started = False
        obj = b"chat.completion.chunk" if endpoint == CHAT else b"text_completion"
        self._head = (
            b'data: {"id":'
            + orjson.dumps(completion_id)
            + b',"object":"'
            + obj
            + b'","created":'
            + str(int(created)).encode()
            + b',"model":'
            + orjson.dumps(model)
        )
        if endpoint == CHAT:
            self.token_prefix = self._head + b',"choices":[{"index":0,"delta":{"content":"'
            self.token_suffix = _CHAT_TOKEN_SUFFIX
            self.reasoning_chunk = (
                self._head + b',"choices":[{"index":0,"delta":{"reasoning_content":" ' + REASONING_WORD + _CHAT_TOKEN_SUFFIX
            )
        else:
            self.token_prefix = self._head + b',"choices":[{"index":0,"text":"'
            self.token_suffix = _TEXT_TOKEN_SUFFIX
            self.reasoning_chunk = b""  # completions have no reasoning field
        calls = self._head + b',"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,'
        self.tool_prefix = calls + b'"function":{"arguments":"'
        self.tool_first_prefix = (
            calls
            + b'"id":'
            + orjson.dumps(call_id_of(completion_id))
            + b',"type":"function","function":{"name":'
            + orjson.dumps(tool or "")
            + b',"arguments":"'
        )

    def token(self, word: int) -> bytes:
        """The chunk carrying one generated word (an index into ``text.WORDS``)."""
        return self.token_prefix + WORD_BYTES[word] + self.token_suffix

    def text_token(self, text: str) -> bytes:
        """The chunk carrying arbitrary generated ``text`` (a known answer's word), JSON-escaped."""
        return self.token_prefix + orjson.dumps(text)[1:-1] + self.token_suffix

    def tool_token(self, word: int) -> bytes:
        """The chunk carrying the next answer token as tool-call arguments (``tool`` is set)."""
        first, self.tool_started = not self.tool_started, True
        self.tool_left -= 1
        piece = orjson.dumps(argument_piece(WORDS_SPACED[word], first, self.tool_left <= 0))[1:-1]
        return (self.tool_first_prefix if first else self.tool_prefix) + piece + _TOOL_TOKEN_SUFFIX

    def reasoning_token(self) -> bytes:
        """The chunk carrying one reasoning token (chat: a ``reasoning_content`` delta)."""
        return self.reasoning_chunk

    def role(self) -> bytes:
        """The chat stream's first chunk: the assistant role, no content (vLLM sends it first)."""
        return self._head + b',"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n'

    def finish(self, reason: str = "length") -> bytes:
        """The chunk that closes the choice with ``finish_reason`` (``tool_calls`` for a tool call
        that ended at its end of sequence; one cut at max_tokens stays ``length``, as in vLLM)."""
        if self.tool and reason == "stop":
            reason = TOOL_CALLS
        body = b'{"index":0,"delta":{},' if self.endpoint == CHAT else b'{"index":0,"text":"",'
        return (
            self._head
            + b',"choices":['
            + body
            + b'"logprobs":null,"finish_reason":"'
            + reason.encode()
            + b'","stop_reason":null}]}\n\n'
        )

    def usage(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int, reasoning_tokens: int = 0) -> bytes:
        """The ``stream_options.include_usage`` chunk: empty choices plus token counts."""
        u = usage_json(prompt_tokens, completion_tokens, cached_tokens, reasoning_tokens)
        return self._head + b',"choices":[],"usage":' + u + b"}\n\n"

    def malformed(self) -> bytes:
        """A chunk that is not JSON (cut inside a string), for the malformed-chunk fault."""
        return self.token_prefix + b"\n\n"


def usage_json(prompt_tokens: int, completion_tokens: int, cached_tokens: int, reasoning_tokens: int = 0) -> bytes:
    u: dict = {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }
    if reasoning_tokens:
        u["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return orjson.dumps(u)


def full_response(
    endpoint: str,
    completion_id: str,
    created: int,
    model: str,
    text: str,
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int,
    reasoning_tokens: int = 0,
    finish: str = "length",
    tool: str | None = None,
) -> bytes:
    """The non-streaming JSON body (``chat.completion`` or ``text_completion``); a chat reply's
    ``reasoning_tokens`` come as ``message.reasoning_content``; ``finish`` is its finish_reason.
    With ``tool``, ``text`` is the arguments of a call of that tool (``message.tool_calls``, no
    content) and a reply that stopped finishes with ``tool_calls``."""
    if endpoint == CHAT:
        message: dict = {"role": "assistant", "content": text}
        if tool:
            call = {"id": call_id_of(completion_id), "type": "function", "function": {"name": tool, "arguments": text}}
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
            finish = TOOL_CALLS if finish == "stop" else finish
        if reasoning_tokens:
            message["reasoning_content"] = (" " + REASONING_WORD.decode()) * reasoning_tokens
        choice = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": finish,
            "stop_reason": None,
        }
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}
        obj = "text_completion"
    return orjson.dumps(
        {
            "id": completion_id,
            "object": obj,
            "created": int(created),
            "model": model,
            "choices": [choice],
            "usage": orjson.loads(usage_json(prompt_tokens, completion_tokens, cached_tokens, reasoning_tokens)),
        }
    )


def error_body(message: str, err_type: str, code: int) -> bytes:
    """OpenAI-style error JSON."""
    return orjson.dumps({"error": {"message": message, "type": err_type, "param": None, "code": code}})
