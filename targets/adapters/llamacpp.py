"""llama-server's native ``POST /completion``.

Request: ``prompt`` (the conversation rendered with the shared chat template), ``n_predict``,
``stream``, ``cache_prompt: true`` (reuse the slot's KV cache for the common prefix), optional
``id_slot`` (pin a slot) and ``ignore_eos``.

Stream: one SSE event per token, ``data: {"content": " the", "tokens": [279], "stop": false,
"id_slot": 0, "tokens_predicted": 1, "tokens_evaluated": 12, ...}``. The last event has
``"stop": true`` and carries ``tokens_predicted``, ``tokens_evaluated``, ``tokens_cached``,
``stop_type`` and ``timings`` (``cache_n``, ``prompt_n``, ``prompt_ms``, ``predicted_n``,
``predicted_ms``, ...). There is no ``[DONE]``: ``stop: true`` ends the stream, and usage comes
from it (prompt = ``tokens_evaluated``, completion = ``tokens_predicted``, cached =
``timings.cache_n``). Silent phases may carry ``:`` comment pings. Errors arrive as
``data: {"error": {...}}`` (older builds: an ``error: {...}`` line).
"""

from __future__ import annotations

from workloads.tokenizer import render_chat

from .base import (
    Adapter,
    ChatRequest,
    PreparedRequest,
    StreamEvent,
    Usage,
    build_headers,
    count_or_none,
    encode_body,
    error_event,
    load_json,
    sse_payload,
    text_or_empty,
)

__all__ = ["LlamaServerAdapter"]


class LlamaServerAdapter(Adapter):
    """Options: ``cache_prompt`` (default True), ``id_slot`` (None: any idle slot),
    ``ignore_eos`` (default True; sent when the request asks), ``temperature`` (sent when set)."""

    name = "llama-server"
    path = "/completion"

    def __init__(
        self,
        *,
        cache_prompt: bool = True,
        id_slot: int | None = None,
        ignore_eos: bool = True,
        temperature: float | None = None,
    ) -> None:
        self.cache_prompt = cache_prompt
        self.id_slot = id_slot
        self.ignore_eos = ignore_eos
        self.temperature = temperature

    def build_request(self, req: ChatRequest) -> PreparedRequest:
        body: dict = {
            "prompt": render_chat(req.messages),
            "n_predict": req.max_tokens,
            "stream": req.stream,
            "cache_prompt": self.cache_prompt,
        }
        if self.id_slot is not None:
            body["id_slot"] = self.id_slot
        if self.ignore_eos and req.ignore_eos:
            body["ignore_eos"] = True
        if self.temperature is not None:
            body["temperature"] = self.temperature
        return PreparedRequest(
            "POST", self.path, build_headers(req, stream=req.stream), encode_body(body, req), req.stream
        )

    def new_stream(self) -> _LlamaStream:
        return _LlamaStream()

    def parse_response(self, body: bytes) -> StreamEvent:
        obj = load_json(body)
        err = error_event(obj)
        if err is not None:
            return err
        ev = _final(obj, text_or_empty(obj.get("content")))
        if ev.usage is not None and ev.usage.completion_tokens is not None:
            ev.tokens = ev.usage.completion_tokens
        return ev


class _LlamaStream:
    __slots__ = ()
    # loadgen/engine/_chat.c applies this parse_line, in C, to the chunks in their plain shapes
    COMPILED_PATH = "llama-server"

    def parse_line(self, line: bytes) -> StreamEvent | None:
        if line.startswith(b"data:"):
            payload = line[5:].strip()
        elif line.startswith(b"error:"):
            obj = load_json(line[6:].strip())
            return error_event(obj) or error_event({"error": obj})
        else:
            payload = sse_payload(line)
            if payload is None:
                return None
        if not payload:
            return None
        obj = load_json(payload)
        err = error_event(obj)
        if err is not None:
            return err
        content = obj.get("content") or ""
        if type(content) is not str:
            content = text_or_empty(content)
        if obj.get("stop"):
            return _final(obj, content)
        tokens = 0
        if content:
            ids = obj.get("tokens")
            tokens = len(ids) if ids and type(ids) is list else 1
        return StreamEvent(tokens, content)


def _final(obj: dict, content: str) -> StreamEvent:
    timings = obj.get("timings")
    cached = count_or_none(timings.get("cache_n")) if type(timings) is dict else None
    if cached is None:
        cached = count_or_none(obj.get("tokens_cached"))
    usage = Usage(count_or_none(obj.get("tokens_evaluated")), count_or_none(obj.get("tokens_predicted")), cached)
    tokens = 0
    if content:
        ids = obj.get("tokens")
        tokens = len(ids) if ids and type(ids) is list else 1
    return StreamEvent(tokens, content, usage, True, timings if type(timings) is dict else None)
