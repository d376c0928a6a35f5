"""SGLang's native ``POST /generate``.

Request: ``text`` (the conversation rendered with the shared chat template), ``sampling_params``
(``max_new_tokens``, ``ignore_eos``, optional ``temperature``), ``stream: true`` and ``rid`` (the
request id, so the server's logs and aborts name the same request).

Stream: ``data: {"text": <text so far>, "output_ids": [...], "meta_info": {"id", "prompt_tokens",
"completion_tokens", "cached_tokens", "finish_reason", ...}}`` per step, then ``data: [DONE]``.
``text`` and ``meta_info.completion_tokens`` are *cumulative*, so the parser keeps per-stream
state: the event's text is the new suffix and its token count the growth of
``completion_tokens`` (several tokens per event with a stream interval > 1 or speculative
decoding). A server started with ``--incremental-streaming-output`` sends only the new text:
pass ``incremental_text=True``. The event whose ``finish_reason`` is set carries the engine's
latencies (``e2e_latency``, ``queue_time``, ...): surfaced as ``server_timings``. Errors arrive
as ``data: {"error": {"message": ...}}`` before ``[DONE]``.
"""

from __future__ import annotations

from workloads.tokenizer import render_chat

from .base import (
    Adapter,
    BadChunk,
    ChatRequest,
    PreparedRequest,
    StreamEvent,
    Usage,
    build_headers,
    count_or_none,
    encode_body,
    error_event,
    load_json,
    sse_json,
)

__all__ = ["SGLangAdapter"]

# meta_info keys that are bookkeeping, not timings.
_NOT_TIMINGS = frozenset(("id", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens"))


class SGLangAdapter(Adapter):
    """Options: ``ignore_eos`` (default True; sent when the request asks), ``temperature`` (sent
    when set), ``incremental_text`` (the server streams text deltas rather than the text so far)."""

    name = "sglang"
    path = "/generate"

    def __init__(
        self,
        *,
        ignore_eos: bool = True,
        temperature: float | None = None,
        incremental_text: bool = False,
    ) -> None:
        self.ignore_eos = ignore_eos
        self.temperature = temperature
        self.incremental_text = incremental_text

    def build_request(self, req: ChatRequest) -> PreparedRequest:
        sampling: dict = {"max_new_tokens": req.max_tokens}
        if self.ignore_eos and req.ignore_eos:
            sampling["ignore_eos"] = True
        if self.temperature is not None:
            sampling["temperature"] = self.temperature
        body = {
            "text": render_chat(req.messages),
            "sampling_params": sampling,
            "stream": req.stream,
            "rid": req.request_id,
        }
        return PreparedRequest(
            "POST", self.path, build_headers(req, stream=req.stream), encode_body(body, req), req.stream
        )

    def new_stream(self) -> _SGLangStream:
        return _SGLangStream(self.incremental_text)

    def parse_response(self, body: bytes) -> StreamEvent:
        obj = load_json(body)
        if isinstance(obj.get("text"), list):  # a batch reply; we never send batches
            obj = {"text": obj["text"][0] if obj["text"] else None}
        err = error_event(obj)
        if err is not None:
            return err
        ev = _SGLangStream(False).event(obj)
        ev.done = True
        if ev.usage is not None and ev.usage.completion_tokens is not None:
            ev.tokens = ev.usage.completion_tokens
        return ev


class _SGLangStream:
    """State of one ``/generate`` stream: text length and tokens seen so far."""

    __slots__ = ("incremental", "seen_chars", "seen_tokens")
    # loadgen/engine/_chat.c (take_sglang) applies event(), in C, to the events in their plain
    # shapes (and hands this parse_line the rest); a subclass that changes them must not inherit this.
    COMPILED_PATH = "sglang"

    def __init__(self, incremental: bool) -> None:
        self.incremental = incremental
        self.seen_chars = 0
        self.seen_tokens = 0

    def parse_line(self, line: bytes) -> StreamEvent | None:
        obj = sse_json(line)
        if type(obj) is not dict:
            return obj
        return self.event(obj)

    def event(self, obj: dict) -> StreamEvent:
        meta = obj.get("meta_info")
        if type(meta) is not dict:
            meta = {}
        text = obj.get("text")
        if text is None:
            new_text = ""
        elif type(text) is not str:
            raise BadChunk("text is not a string in an SGLang /generate event")
        elif self.incremental:
            new_text = text
        else:
            new_text = text[self.seen_chars :]
            self.seen_chars = len(text)
        completion = meta.get("completion_tokens")
        if completion is not None and type(completion) is not int:
            raise BadChunk("meta_info.completion_tokens is not an integer in an SGLang /generate event")
        tokens = 0
        if completion is not None:
            grown = completion - self.seen_tokens
            # Without text (skip_tokenizer_init) the count alone says a token arrived.
            if grown > 0 and (new_text or text is None):
                tokens = grown
                self.seen_tokens = completion
            elif new_text:
                tokens = 1  # visible text is a token-bearing chunk even if the count lags
        elif new_text:
            tokens = 1
        usage = None
        if meta:
            usage = Usage(
                count_or_none(meta.get("prompt_tokens")),
                count_or_none(completion),
                count_or_none(meta.get("cached_tokens")),
            )
        timings = None
        if meta.get("finish_reason") is not None:
            timings = {k: v for k, v in meta.items() if k not in _NOT_TIMINGS and type(v) in (int, float)}
        return StreamEvent(tokens, new_text, usage, False, timings)
