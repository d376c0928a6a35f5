"""Bytes on the wire: OpenAI/vLLM-shaped SSE chunks and JSON bodies, pre-encoded for speed.

A stream's chunks differ only in the generated word, so each request builds its chunk prefix once
(``StreamTemplate``) and a token chunk is ``prefix + WORD_BYTES[w] + suffix``: one concatenation,
no dict, no JSON encoder per token. Vocabulary words are plain ASCII letters, so they need no
escaping inside the JSON string.
"""

from __future__ import annotations

import orjson

from targets.sim.text import WORDS

CHAT = "chat"
COMPLETIONS = "completions"

WORD_BYTES: tuple[bytes, ...] = tuple((" " + w).encode() for w in WORDS)
# What every reasoning token says: a word outside the vocabulary (one token to the shared
# tokenizer), so a prompt that holds it holds reasoning sent back.
REASONING_WORD = b"ponder"
DONE = b"data: [DONE]\n\n"

_CHAT_TOKEN_SUFFIX = b'"},"logprobs":null,"finish_reason":null}]}\n\n'
_TEXT_TOKEN_SUFFIX = b'","logprobs":null,"finish_reason":null}]}\n\n'


class StreamTemplate:
    """Pre-encoded pieces of one request's SSE stream."""

    __slots__ = ("_head", "endpoint", "reasoning_chunk", "token_prefix", "token_suffix")

    def __init__(self, endpoint: str, completion_id: str, created: int, model: str) -> None:
        self.endpoint = endpoint
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

    def token(self, word: int) -> bytes:
        """The chunk carrying one generated word (an index into ``text.WORDS``)."""
        return self.token_prefix + WORD_BYTES[word] + self.token_suffix

    def text_token(self, text: str) -> bytes:
        """The chunk carrying arbitrary generated ``text`` (a known answer's word), JSON-escaped."""
        return self.token_prefix + orjson.dumps(text)[1:-1] + self.token_suffix

    def reasoning_token(self) -> bytes:
        """The chunk carrying one reasoning token (chat: a ``reasoning_content`` delta)."""
        return self.reasoning_chunk

    def role(self) -> bytes:
        """The chat stream's first chunk: the assistant role, no content (vLLM sends it first)."""
        return self._head + b',"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n'

    def finish(self, reason: str = "length") -> bytes:
        """The chunk that closes the choice with ``finish_reason``."""
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
) -> bytes:
    """The non-streaming JSON body (``chat.completion`` or ``text_completion``); a chat reply's
    ``reasoning_tokens`` come as ``message.reasoning_content``; ``finish`` is its finish_reason."""
    if endpoint == CHAT:
        message = {"role": "assistant", "content": text}
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
