"""Property tests of every adapter's stream parser: any line is an event, nothing, or BadChunk.

Hostile or broken servers send anything: JSON of the wrong shape (a number where text belongs, a
list where an object belongs), invalid JSON, bytes that are not UTF-8, SSE comments and fields,
``\\r\\n`` line ends. Whatever comes, a parser returns a well-typed ``StreamEvent`` (or None) or
raises ``BadChunk``, which the client records as ``bad_chunk``; any other exception would end a
session's greenlet. Well-formed streams, wrapped in the noise servers add, parse to exactly the
text and token counts they carry.

Examples are derandomized and few, so the run is bounded and the same on every machine.
"""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from targets.adapters.anthropic import AnthropicMessagesAdapter
from targets.adapters.base import BadChunk, StreamEvent, Usage
from targets.adapters.llamacpp import LlamaServerAdapter
from targets.adapters.openai import OpenAIChatAdapter, OpenAICompletionsAdapter
from targets.adapters.responses import OpenAIResponsesAdapter
from targets.adapters.sglang import SGLangAdapter

# The adapters whose streams the well-formed cases below build (the OpenAI-style wire formats).
ADAPTERS = (OpenAIChatAdapter(), OpenAICompletionsAdapter(), LlamaServerAdapter(), SGLangAdapter())
# Every built-in adapter: none may crash on input of any shape (the agents' APIs included).
ALL_ADAPTERS = (*ADAPTERS, AnthropicMessagesAdapter(), OpenAIResponsesAdapter())
BOUNDED = settings(
    max_examples=60, derandomize=True, deadline=500, suppress_health_check=[HealthCheck.too_slow]
)

# JSON built from the keys the parsers look at, with values of every JSON type in every place.
KEYS = (
    "choices", "delta", "message", "content", "reasoning_content", "reasoning", "text", "tool_calls",
    "usage", "completion_tokens", "prompt_tokens", "prompt_tokens_details", "cached_tokens", "timings",
    "cache_n", "meta_info", "finish_reason", "tokens", "stop", "tokens_predicted", "tokens_evaluated",
    "tokens_cached", "error", "object", "message", "code", "type",
)  # fmt: skip
scalars = st.none() | st.booleans() | st.integers(-3, 2**70) | st.floats(allow_nan=False) | st.text(max_size=8)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(KEYS), inner, max_size=4),
    max_leaves=12,
)
json_objects = st.dictionaries(st.sampled_from(KEYS), json_values, max_size=5)


def check_event(ev: object) -> None:
    """What the client relies on: the types of every field it reads."""
    if ev is None:
        return
    assert type(ev) is StreamEvent
    assert type(ev.tokens) is int and ev.tokens >= 0
    assert type(ev.text) is str
    assert type(ev.done) is bool
    assert type(ev.reasoning) is bool
    assert ev.error is None or type(ev.error) is str
    assert ev.error_code is None or type(ev.error_code) is int
    assert ev.server_timings is None or type(ev.server_timings) is dict
    if ev.usage is not None:
        assert type(ev.usage) is Usage
        u = ev.usage
        for n in (u.prompt_tokens, u.completion_tokens, u.cached_tokens, u.reasoning_tokens):
            assert n is None or (type(n) is int and n >= 0)


def parse_all(adapter, lines: list[bytes]) -> list[StreamEvent | None]:
    parser = adapter.new_stream()
    out = []
    for line in lines:
        try:
            ev = parser.parse_line(line)
        except BadChunk:
            continue
        check_event(ev)
        out.append(ev)
    return out


@BOUNDED
@given(st.lists(json_objects, min_size=1, max_size=6), st.sampled_from([b"data: ", b"data:", b"error: "]))
def test_json_of_any_shape_is_an_event_or_bad_chunk(objs, prefix):
    lines = [prefix + json.dumps(o).encode() + b"\n" for o in objs]
    for adapter in ALL_ADAPTERS:
        parse_all(adapter, lines)


@BOUNDED
@given(st.lists(st.binary(max_size=40), min_size=1, max_size=5))
def test_arbitrary_bytes_are_an_event_or_bad_chunk(lines):
    for adapter in ALL_ADAPTERS:
        parse_all(adapter, [b"data: " + b for b in lines])
        parse_all(adapter, lines)


@BOUNDED
@given(json_values)
def test_whole_bodies_of_any_shape_are_an_event_or_bad_chunk(value):
    body = json.dumps(value).encode()
    for adapter in ALL_ADAPTERS:
        try:
            ev = adapter.parse_response(body)
        except BadChunk:
            continue
        check_event(ev)
    for adapter in ALL_ADAPTERS:
        try:
            check_event(adapter.parse_response(body[:-1] + b"\xff"))
        except BadChunk:
            pass


# ---- well-formed streams in the noise servers add -------------------------------------------------

NOISE = (b": ping", b":", b"event: message", b"event:delta", b"id: 17", b"retry: 3000", b"", b"   ")
texts = st.lists(st.text(min_size=1, max_size=5), max_size=8)


def wire(adapter_name: str, tokens: list[str]) -> list[bytes]:
    """The payload lines (without ``data:`` and line end) a server of that flavour sends."""
    n = len(tokens)
    if adapter_name == "openai-chat":
        out = [{"choices": [{"delta": {"role": "assistant", "content": ""}}]}]
        out += [{"choices": [{"delta": {"content": t}}]} for t in tokens]
        out.append({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": n}})
        return [_json(o) for o in out] + [b"[DONE]"]
    if adapter_name == "openai-completions":
        out = [{"choices": [{"text": t}]} for t in tokens]
        out.append({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": n}})
        return [_json(o) for o in out] + [b"[DONE]"]
    if adapter_name == "sglang":
        out, so_far = [], ""
        for i, t in enumerate(tokens, 1):
            so_far += t
            out.append({"text": so_far, "meta_info": {"completion_tokens": i, "prompt_tokens": 3}})
        meta = {"completion_tokens": n, "prompt_tokens": 3, "finish_reason": {"type": "length"}, "e2e_latency": 0.5}
        out.append({"text": so_far, "meta_info": meta})
        return [_json(o) for o in out] + [b"[DONE]"]
    out = [{"content": t, "tokens": [7], "stop": False} for t in tokens]
    out.append({"content": "", "stop": True, "tokens_predicted": n, "tokens_evaluated": 3})
    return [_json(o) for o in out]


def _json(obj: dict) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode()  # raw UTF-8, as servers send it


@BOUNDED
@given(
    texts,
    st.sampled_from([b"\n", b"\r\n"]),
    st.sampled_from([b"data: ", b"data:"]),
    st.lists(st.lists(st.sampled_from(NOISE), max_size=3), min_size=12, max_size=12),
    st.booleans(),
)
def test_well_formed_streams_in_noise_parse_exactly(tokens, eol, prefix, noise, done_twice):
    for adapter in ADAPTERS:
        lines: list[bytes] = []
        for i, payload in enumerate(wire(adapter.name, tokens)):
            lines += [n + eol for n in noise[i % len(noise)]]
            lines.append(prefix + payload + eol)
        if done_twice and adapter.name != "llama-server":
            lines.append(prefix + b"[DONE]" + eol)
        events = [ev for ev in parse_all(adapter, lines) if ev is not None]
        assert "".join(ev.text for ev in events) == "".join(tokens), adapter.name
        assert sum(ev.tokens for ev in events) == len(tokens), adapter.name
        assert [ev.done for ev in events].count(True) == (2 if done_twice and adapter.name != "llama-server" else 1)
        assert events[-1].done
        usage = [ev.usage for ev in events if ev.usage is not None]
        assert usage and usage[-1].completion_tokens == len(tokens), adapter.name


@BOUNDED
@given(texts, st.sampled_from([429, 400, 503, None, "busy"]))
def test_an_error_event_mid_stream_is_an_error(tokens, code):
    """vLLM and SGLang send ``{"error": ...}`` as a data line when a request fails mid-stream."""
    error = {"error": {"message": "engine\nfailed", "type": "InternalServerError", "code": code}}
    for adapter in ADAPTERS:
        lines = [b"data: " + p + b"\n" for p in wire(adapter.name, tokens)[: len(tokens) // 2]]
        lines.append(b"data: " + json.dumps(error).encode() + b"\n")
        events = [ev for ev in parse_all(adapter, lines) if ev is not None]
        assert events[-1].error == "engine failed", adapter.name
        assert events[-1].error_code == (code if isinstance(code, int) else None)


# The agents' APIs: events named by their "type", with values of every JSON type in every place.
AGENT_KEYS = (
    "type", "message", "usage", "input_tokens", "output_tokens", "cache_read_input_tokens",
    "cache_creation_input_tokens", "delta", "text", "thinking", "partial_json", "error", "code",
    "response", "status", "output", "content", "input_tokens_details", "cached_tokens",
)  # fmt: skip
AGENT_TYPES = (
    "message_start", "message_delta", "message_stop", "content_block_delta", "error", "ping", "text_delta",
    "thinking_delta", "input_json_delta", "response.output_text.delta", "response.completed",
    "response.incomplete", "response.failed", "response.reasoning_text.delta", "message", "output_text",
)  # fmt: skip
_agent_scalars = st.none() | st.booleans() | st.integers(-3, 2**70) | st.text(max_size=6) | st.sampled_from(AGENT_TYPES)
_agent_values = st.recursive(
    _agent_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(AGENT_KEYS), inner, max_size=4),
    max_leaves=12,
)
_agent_objects = st.dictionaries(st.sampled_from(AGENT_KEYS), _agent_values, max_size=5)


@settings(max_examples=80, derandomize=True, deadline=500, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_agent_objects, min_size=1, max_size=6))
def test_agent_api_events_of_any_shape_are_an_event_or_bad_chunk(objs):
    for adapter in (AnthropicMessagesAdapter(), OpenAIResponsesAdapter()):
        parser = adapter.new_stream()
        for obj in objs:
            # The stdlib's encoder: a server may send integers past 64 bits, which orjson cannot write.
            wire = json.dumps(obj).encode()
            try:
                check_event(parser.parse_line(b"data: " + wire))
            except BadChunk:
                pass
            try:
                check_event(adapter.parse_response(wire))
            except BadChunk:
                pass
