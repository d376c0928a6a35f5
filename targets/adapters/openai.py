"""OpenAI-compatible adapters: ``/v1/chat/completions`` and ``/v1/completions``.

Spoken by vLLM, SGLang, llama-server, the routers in front of them and the simulated engine.
The wire format (server-sent events, one JSON chunk per ``data:`` line, ``data: [DONE]`` last):

* the first chat chunk is role-only: ``delta: {"role": "assistant", "content": ""}`` (vLLM) or
  ``"content": null`` (llama-server); it carries no token;
* each later chunk carries ``delta.content`` and/or ``delta.reasoning_content`` (``reasoning`` in
  newer vLLM) for reasoning models; completions chunks carry ``choices[0].text``. A chunk with
  reasoning and no content or tool call is a reasoning chunk (``StreamEvent.reasoning``); its
  text is not reply text (not sent back in the history) unless ``reasoning_in_history``;
  ``usage.completion_tokens_details.reasoning_tokens`` is surfaced as ``Usage.reasoning_tokens``;
* with ``stream_options.include_usage`` (always asked) a last chunk with ``choices: []`` carries
  ``usage`` (``prompt_tokens``, ``completion_tokens``, ``prompt_tokens_details.cached_tokens``);
* with vLLM's ``continuous_usage_stats`` every chunk carries the cumulative ``usage``, which tells
  how many tokens a chunk holds (speculative decoding or a stream interval > 1 batch several);
* ``choices[].index`` is 0: loadgen asks for one choice (no ``n``). A chunk of another choice (a
  server or proxy that sets ``n`` > 1 interleaves every choice's chunks) is ``BadChunk``: it is
  never counted as this reply's tokens, added to its text or timed as its ITL;
* llama-server adds a ``timings`` object (``prompt_n``, ``cache_n``, ``prompt_ms``,
  ``predicted_n``, ``predicted_ms``, ...) to its final chunk: surfaced as ``server_timings``.
"""

from __future__ import annotations

import orjson

from workloads.tokenizer import render_chat

from .base import (
    Adapter,
    BadChunk,
    ChatRequest,
    PreparedRequest,
    StreamEvent,
    build_headers,
    encode_body,
    error_event,
    load_json,
    sse_json,
    text_or_empty,
    usage_from_openai,
)

__all__ = ["OpenAIChatAdapter", "OpenAICompletionsAdapter"]


class _OpenAIAdapter(Adapter):
    """Options shared by both OpenAI flavours.

    ``ignore_eos`` (vLLM, SGLang, llama-server, sim; the OpenAI service rejects it): send
    ``ignore_eos`` when the request asks for it. ``min_tokens`` (vLLM, SGLang): a floor on the
    generated length. ``continuous_usage_stats`` (vLLM): cumulative usage on every chunk.
    ``temperature``: sent when set. ``reasoning_in_history`` (chat): keep a reasoning model's
    reasoning text in the reply text that goes back into the conversation; off by default, as
    agent clients drop it.
    """

    def __init__(
        self,
        *,
        ignore_eos: bool = True,
        min_tokens: int | None = None,
        continuous_usage_stats: bool = False,
        temperature: float | None = None,
        reasoning_in_history: bool = False,
    ) -> None:
        self.ignore_eos = ignore_eos
        self.reasoning_in_history = reasoning_in_history
        self.min_tokens = min_tokens
        self.continuous_usage_stats = continuous_usage_stats
        self.temperature = temperature

    def _body(self, req: ChatRequest) -> dict:
        body: dict = {}
        if req.model is not None:
            body["model"] = req.model
        body["max_tokens"] = req.max_tokens
        body["stream"] = req.stream
        if req.stream:
            opts = {"include_usage": True}
            if self.continuous_usage_stats:
                opts["continuous_usage_stats"] = True
            body["stream_options"] = opts
        if self.ignore_eos and req.ignore_eos:
            body["ignore_eos"] = True
        if self.min_tokens is not None:
            body["min_tokens"] = self.min_tokens
        if self.temperature is not None:
            body["temperature"] = self.temperature
        body["user"] = req.session_id
        return body

    def _prepare(self, body: dict, req: ChatRequest) -> PreparedRequest:
        return PreparedRequest(
            "POST", self.path, build_headers(req, stream=req.stream), encode_body(body, req), req.stream
        )


class OpenAIChatAdapter(_OpenAIAdapter):
    """``POST /v1/chat/completions`` with ``messages``."""

    name = "openai-chat"
    path = "/v1/chat/completions"
    accepts_tools = True

    def build_request(self, req: ChatRequest) -> PreparedRequest:
        body = self._body(req)
        body["messages"] = req.messages
        return self._prepare(body, req)

    def new_stream(self) -> _ChatStream:
        return _ChatStream(self.reasoning_in_history)

    def parse_response(self, body: bytes) -> StreamEvent:
        obj = load_json(body)
        err = error_event(obj)
        if err is not None:
            return err
        text = ""
        msg = _first_choice(obj).get("message") or {}
        if type(msg) is not dict:
            raise BadChunk("choices[0].message is not a JSON object")
        reasoning = text_or_empty(msg.get("reasoning_content") or msg.get("reasoning"))
        text = text_or_empty(msg.get("content"))
        if self.reasoning_in_history:
            text = reasoning + text
        return _final_event(obj, text, bool(reasoning))


class OpenAICompletionsAdapter(_OpenAIAdapter):
    """``POST /v1/completions`` with ``prompt = render_chat(messages)`` (the shared chat template)."""

    name = "openai-completions"
    path = "/v1/completions"

    def build_request(self, req: ChatRequest) -> PreparedRequest:
        body = self._body(req)
        body["prompt"] = render_chat(req.messages)
        return self._prepare(body, req)

    def new_stream(self) -> _CompletionsStream:
        return _CompletionsStream()

    def parse_response(self, body: bytes) -> StreamEvent:
        obj = load_json(body)
        err = error_event(obj)
        if err is not None:
            return err
        text = text_or_empty(_first_choice(obj).get("text"))
        return _final_event(obj, text)


def _first_choice(obj: dict) -> dict:
    """``choices[0]``, or {} when there is none (the usage chunk); BadChunk when malformed, or when
    the body holds another choice than the one asked for (loadgen never asks for ``n`` > 1)."""
    choices = obj.get("choices")
    if not choices:
        return {}
    if type(choices) is not list or type(choices[0]) is not dict:
        raise BadChunk("choices is not a list of JSON objects")
    for c in choices:
        index = c.get("index") if type(c) is dict else None
        if index is not None and index != 0:
            raise BadChunk(f"the server sent choice index {index}; loadgen asks for one choice (n=1)")
    return choices[0]


def _other_choice(choices: list) -> None:
    """Raise BadChunk for a chunk of a choice other than index 0 (``choices[].index``): with
    ``n`` > 1 a server interleaves every choice's chunks, and merging them into one reply would
    count another answer's tokens as this one's and time gaps between two answers as ITL.
    loadgen asks for one choice, so such a stream is the server's error, never mixed in."""
    for c in choices:
        index = c.get("index") if type(c) is dict else None
        if index is not None and index != 0:
            raise BadChunk(f"the server streamed choice index {index}; loadgen asks for one choice (n=1)")


def _timings(obj: dict) -> dict | None:
    t = obj.get("timings")
    return t if type(t) is dict else None


def _final_event(obj: dict, text: str, reasoned: bool = False) -> StreamEvent:
    u = obj.get("usage")
    usage = usage_from_openai(u) if u else None
    tokens = (
        usage.completion_tokens if usage and usage.completion_tokens is not None else int(bool(text) or reasoned)
    )
    return StreamEvent(tokens=tokens, text=text, usage=usage, done=True, server_timings=_timings(obj))


class _OpenAIStream:
    """Shared per-stream state: tokens already counted, for cumulative-usage attribution."""

    __slots__ = ("counted",)

    def __init__(self) -> None:
        self.counted = 0

    def _event(self, obj: dict, text: str, generated: bool, reasoning: bool = False) -> StreamEvent:
        u = obj.get("usage")
        usage = usage_from_openai(u) if u else None
        tokens = 0
        if generated:
            tokens = 1
            # Continuous usage: the cumulative count says how many tokens this chunk holds.
            # Tokens that produced no text (held-back bytes, special tokens) land on the next
            # token-bearing chunk, so the sum of chunk tokens tracks completion_tokens.
            if usage is not None and usage.completion_tokens is not None:
                tokens = max(1, usage.completion_tokens - self.counted)
            self.counted += tokens
        return StreamEvent(tokens, text, usage, False, _timings(obj), None, None, reasoning)

    def _load(self, line: bytes) -> dict | StreamEvent | None:
        return sse_json(line)


class _ChatStream(_OpenAIStream):
    __slots__ = ("keep_reasoning",)
    # loadgen/engine/_chat.c applies this class's parse_line, in C, to the lines in their plain
    # shapes (and hands it the rest); a subclass that changes parse_line must not inherit this.
    COMPILED_PATH = "openai-chat"

    def __init__(self, keep_reasoning: bool = False) -> None:
        super().__init__()
        self.keep_reasoning = keep_reasoning

    def parse_line(self, line: bytes) -> StreamEvent | None:
        # Fast path for the line nearly every chunk is, ``data: {...}``: one JSON parse and no
        # generic SSE handling (~40% of this method's cost, run once per streamed chunk). Any
        # other line, or one that is not valid JSON, takes the general path and its messages.
        obj = None
        if line.startswith(b"data: {"):
            try:
                obj = orjson.loads(line[6:])
            except orjson.JSONDecodeError:
                obj = None
            else:
                if ("error" in obj or obj.get("object") == "error") and (err := error_event(obj)) is not None:
                    return err
        if obj is None:
            obj = self._load(line)
            if type(obj) is not dict:
                return obj
        text = ""
        generated = is_reasoning = False
        choices = obj.get("choices")
        if choices:
            c0 = choices[0] if type(choices) is list else None
            delta = c0.get("delta") if type(c0) is dict else _malformed("choices[0]")
            if c0.get("index") or len(choices) > 1:  # index 0, or none, is the one choice asked for
                _other_choice(choices)
            if delta:
                if type(delta) is not dict:
                    _malformed("choices[0].delta")
                content = delta.get("content")
                reasoning = delta.get("reasoning_content") or delta.get("reasoning")
                if (content is not None and type(content) is not str) or (
                    reasoning and type(reasoning) is not str
                ):
                    _malformed("the delta's content")
                # Reasoning with answer (content or a tool call) in one chunk: an answer chunk.
                if content:
                    text = reasoning + content if reasoning and self.keep_reasoning else content
                    generated = True
                elif reasoning:
                    generated = True
                    is_reasoning = not delta.get("tool_calls")
                    if self.keep_reasoning:
                        text = reasoning
                else:  # a tool-call delta is generated output too, though not reply text
                    generated = bool(delta.get("tool_calls"))
        return self._event(obj, text, generated, is_reasoning)


class _CompletionsStream(_OpenAIStream):
    __slots__ = ()
    COMPILED_PATH = "openai-completions"  # as _ChatStream's: loadgen/engine/_chat.c

    def parse_line(self, line: bytes) -> StreamEvent | None:
        obj = self._load(line)
        if type(obj) is not dict:
            return obj
        text = ""
        choices = obj.get("choices")
        if choices:
            c0 = choices[0] if type(choices) is list else None
            text = (c0.get("text") or "") if type(c0) is dict else _malformed("choices[0]")
            if c0.get("index") or len(choices) > 1:
                _other_choice(choices)
            if type(text) is not str:
                _malformed("choices[0].text")
        return self._event(obj, text, bool(text))


def _malformed(what: str) -> None:
    """Raise BadChunk: a chunk whose ``what`` has the wrong JSON type."""
    raise BadChunk(f"{what} has the wrong JSON type for an OpenAI stream chunk")
