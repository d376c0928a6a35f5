"""SGLang's native /generate adapter: request shape and cumulative-text stream parsing."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from targets.adapters.base import BadChunk, ChatRequest, Usage
from targets.adapters.sglang import SGLangAdapter
from workloads.tokenizer import render_chat

TRANSCRIPTS = Path(__file__).resolve().parent.parent / "fixtures" / "transcripts"
MESSAGES = [{"role": "user", "content": "hello"}]


def request(**kw) -> ChatRequest:
    base = dict(messages=MESSAGES, max_tokens=16, session_id="s-2", request_id="r-2")
    base.update(kw)
    return ChatRequest(**base)


def test_request_body():
    p = SGLangAdapter().build_request(request())
    assert (p.method, p.path) == ("POST", "/generate")
    assert p.headers["X-Session-ID"] == "s-2" and p.headers["X-Request-ID"] == "r-2"
    assert orjson.loads(p.body) == {
        "text": render_chat(MESSAGES),
        "sampling_params": {"max_new_tokens": 16, "ignore_eos": True},
        "stream": True,
        "rid": "r-2",
    }
    body = orjson.loads(SGLangAdapter(ignore_eos=False, temperature=0.5).build_request(request()).body)
    assert body["sampling_params"] == {"max_new_tokens": 16, "temperature": 0.5}


def test_cumulative_stream_becomes_deltas():
    parser = SGLangAdapter().new_stream()
    events = []
    for line in (TRANSCRIPTS / "sglang_generate_stream.sse").read_bytes().splitlines(keepends=True):
        ev = parser.parse_line(line)
        if ev is not None:
            events.append(ev)
    assert [e.tokens for e in events[:-1]] == [1] * 10
    assert [e.text for e in events[:3]] == [" The", " quick", " brown"]
    assert "".join(e.text for e in events) == " The quick brown fox jumps over the lazy dog."
    assert events[-2].usage == Usage(42, 10, 16)
    assert events[-2].server_timings == {"total_retractions": 0, "e2e_latency": pytest.approx(0.1934)}
    assert all(e.server_timings is None for e in events[:-2])
    assert events[-1].done and not any(e.done for e in events[:-1])


def test_several_tokens_per_event():
    parser = SGLangAdapter().new_stream()

    def ev(text: str, n: int):
        line = orjson.dumps({"text": text, "meta_info": {"completion_tokens": n, "prompt_tokens": 4}})
        return parser.parse_line(b"data: " + line + b"\n")

    # The event without new text (a token the detokenizer holds back) carries no token; the held
    # token lands on the next event with text, so the chunk tokens still add up to the count.
    assert (ev(" a b", 2).tokens, ev(" a b", 3).tokens, ev(" a b c d", 5).tokens) == (2, 0, 3)


def test_state_is_per_stream_and_parse_line_is_a_fresh_stream():
    a = SGLangAdapter()
    line = b'data: {"text":" x y","meta_info":{"completion_tokens":2}}\n'
    assert a.parse_line(line).text == " x y"
    assert a.parse_line(line).text == " x y"  # each call starts a fresh stream
    s = a.new_stream()
    s.parse_line(line)
    assert s.parse_line(line).tokens == 0 and s.parse_line(line).text == ""


def test_incremental_text_option():
    s = SGLangAdapter(incremental_text=True).new_stream()
    e1 = s.parse_line(b'data: {"text":" x","meta_info":{"completion_tokens":1}}\n')
    e2 = s.parse_line(b'data: {"text":" y","meta_info":{"completion_tokens":2}}\n')
    assert (e1.text, e2.text, e1.tokens, e2.tokens) == (" x", " y", 1, 1)


def test_token_ids_only_stream():
    s = SGLangAdapter().new_stream()
    ev = s.parse_line(b'data: {"output_ids":[5,6],"meta_info":{"completion_tokens":2}}\n')
    assert (ev.tokens, ev.text) == (2, "")


def test_error_and_bad_lines():
    ev = SGLangAdapter().parse_line(b'data: {"error": {"message": "prompt too long"}}\n')
    assert ev.error == "prompt too long" and ev.error_code is None
    with pytest.raises(BadChunk):
        SGLangAdapter().parse_line(b"data: {oops}\n")


def test_parse_response():
    body = b'{"text":" a b","meta_info":{"prompt_tokens":5,"completion_tokens":2,"cached_tokens":1,"finish_reason":{"type":"length","length":2},"e2e_latency":0.05}}'
    ev = SGLangAdapter().parse_response(body)
    assert (ev.text, ev.tokens, ev.done, ev.usage) == (" a b", 2, True, Usage(5, 2, 1))
    assert ev.server_timings == {"e2e_latency": 0.05}
