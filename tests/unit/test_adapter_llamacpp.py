"""llama-server's native /completion adapter: request shape and stream parsing (no [DONE])."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from targets.adapters.base import BadChunk, ChatRequest, Usage
from targets.adapters.llamacpp import LlamaServerAdapter
from workloads.tokenizer import render_chat

TRANSCRIPTS = Path(__file__).resolve().parent.parent / "fixtures" / "transcripts"
MESSAGES = [{"role": "user", "content": "list the files"}]


def request(**kw) -> ChatRequest:
    base = dict(messages=MESSAGES, max_tokens=32, session_id="s-1", request_id="r-1")
    base.update(kw)
    return ChatRequest(**base)


def test_request_body():
    p = LlamaServerAdapter().build_request(request(model="ignored"))
    assert (p.method, p.path) == ("POST", "/completion")
    assert p.headers["X-Request-ID"] == "r-1" and p.headers["X-Session-ID"] == "s-1"
    assert p.headers["Accept"] == "text/event-stream"
    assert orjson.loads(p.body) == {
        "prompt": render_chat(MESSAGES),
        "n_predict": 32,
        "stream": True,
        "cache_prompt": True,
        "ignore_eos": True,
    }


def test_request_options():
    p = LlamaServerAdapter(cache_prompt=False, id_slot=2, ignore_eos=False, temperature=0.0).build_request(
        request()
    )
    body = orjson.loads(p.body)
    assert body["cache_prompt"] is False and body["id_slot"] == 2 and body["temperature"] == 0.0
    assert "ignore_eos" not in body
    body = orjson.loads(LlamaServerAdapter().build_request(request(extra_body={"id_slot": 1})).body)
    assert body["id_slot"] == 1


def test_native_stream_ends_on_stop_true_with_usage_and_timings():
    parser = LlamaServerAdapter().new_stream()
    events = []
    for line in (TRANSCRIPTS / "llamacpp_completion_stream.sse").read_bytes().splitlines(keepends=True):
        ev = parser.parse_line(line)
        if ev is not None:
            events.append(ev)
    assert len(events) == 11  # ten tokens (the ": ping" comment carries nothing) and the stop event
    assert [e.tokens for e in events[:10]] == [1] * 10
    assert "".join(e.text for e in events) == " The quick brown fox jumps over the lazy dog."
    last = events[-1]
    assert last.done and last.tokens == 0 and not any(e.done for e in events[:-1])
    assert last.usage == Usage(prompt_tokens=42, completion_tokens=10, cached_tokens=16)
    assert last.server_timings["prompt_n"] == 26 and last.server_timings["predicted_ms"] == pytest.approx(
        161.52
    )


def test_tokens_list_gives_the_count():
    ev = LlamaServerAdapter().parse_line(b'data: {"content":"ab","tokens":[1,2],"stop":false}\n')
    assert ev.tokens == 2
    ev = LlamaServerAdapter().parse_line(b'data: {"content":"","tokens":[],"stop":false}\n')
    assert ev.tokens == 0


def test_cached_falls_back_to_tokens_cached():
    ev = LlamaServerAdapter().parse_line(
        b'data: {"content":"","stop":true,"tokens_predicted":3,"tokens_evaluated":9,"tokens_cached":5}\n'
    )
    assert ev.done and ev.usage == Usage(9, 3, 5) and ev.server_timings is None


@pytest.mark.parametrize(
    "line",
    [
        b'data: {"error":{"code":500,"message":"slot unavailable","type":"server_error"}}\n',
        b'error: {"code":500,"message":"slot unavailable","type":"server_error"}\n',
    ],
)
def test_errors_in_stream(line):
    ev = LlamaServerAdapter().parse_line(line)
    assert (ev.error, ev.error_code) == ("slot unavailable", 500)


def test_bad_lines():
    with pytest.raises(BadChunk):
        LlamaServerAdapter().parse_line(b'data: {"content": "x"\n')
    with pytest.raises(BadChunk):
        LlamaServerAdapter().parse_line(b"Internal Server Error\n")


def test_parse_response():
    body = (
        b'{"content":" a b c","stop":true,"tokens_predicted":3,"tokens_evaluated":7,"timings":{"cache_n":4}}'
    )
    ev = LlamaServerAdapter().parse_response(body)
    assert (ev.text, ev.tokens, ev.done, ev.usage) == (" a b c", 3, True, Usage(7, 3, 4))
