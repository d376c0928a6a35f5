"""Recorded vLLM, SGLang and llama-server streams, replayed over HTTP, read by the real client.

The replay server writes each recorded event with a pause between events and logs when it
wrote it. Whatever the engine's wire format (role-only first chunk, usage chunk, cumulative
text, ``stop: true`` without ``[DONE]``), the client must come back with the same
``StreamResult``: the same text, token count and usage, and token times that match the writes
of the token-bearing events (not the role-only or usage ones).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from targets.adapters.base import Usage
from targets.registry import get_adapter
from tests.integration.test_client_stream import (
    assert_on_time,
    chat,
    run,
    start_servers,
    stop_servers,
)

TRANSCRIPTS = Path(__file__).resolve().parent.parent / "fixtures" / "transcripts"
TEXT = " The quick brown fox jumps over the lazy dog."

CASES = [
    # (transcript, adapter, adapter options, token-bearing chunks)
    ("vllm_chat_stream.sse", "openai-chat", {}, 10),
    ("vllm_chat_continuous_usage.sse", "openai-chat", {"continuous_usage_stats": True}, 9),
    ("vllm_completions_stream.sse", "openai-completions", {}, 10),
    ("llamacpp_chat_stream.sse", "openai-chat", {}, 10),
    ("llamacpp_completion_stream.sse", "llama-server", {}, 10),
    ("sglang_generate_stream.sse", "sglang", {}, 10),
]


@pytest.fixture(scope="module")
def servers():
    s = start_servers()
    yield s
    stop_servers(s)


def token_event_indexes(adapter, name: str) -> list[int]:
    """Indexes (among the non-blank events the replay server writes) of token-bearing events."""
    parser = adapter.new_stream()
    out = []
    events = [e for e in (TRANSCRIPTS / name).read_bytes().split(b"\n\n") if e.strip()]
    for i, ev in enumerate(events):
        for line in ev.splitlines(keepends=True):
            parsed = parser.parse_line(line)
            if parsed is not None and parsed.tokens:
                out.append(i)
    return out


@pytest.mark.parametrize(("name", "adapter_name", "options", "chunks"), CASES, ids=[c[0] for c in CASES])
def test_replayed_engine_stream(servers, name, adapter_name, options, chunks):
    adapter = get_adapter(adapter_name, **options)
    req = chat(10, delay_ms=25)
    res = run(servers.http, f"replay/{name}", req, adapter=adapter)
    assert res.ok, res.error_message
    assert res.http_status == 200
    assert res.text == TEXT
    assert res.usage == Usage(prompt_tokens=42, completion_tokens=10, cached_tokens=16)
    assert res.output_tokens == 10 and sum(res.chunk_tokens) == 10
    assert len(res.chunk_ns) == chunks
    written = servers.log(req.request_id)["events"]
    expected = [written[i] for i in token_event_indexes(adapter, name)]
    assert_on_time(res.chunk_ns, expected)
    assert res.t_first_ns == res.chunk_ns[0]
    assert res.t_end_ns >= written[-1]


def test_first_token_skips_the_role_only_chunk(servers):
    """vLLM's role-only chunk arrives 25 ms before the first token; TTFT must not stop at it."""
    req = chat(10, delay_ms=25)
    res = run(servers.http, "replay/vllm_chat_stream.sse", req, adapter=get_adapter("openai-chat"))
    written = servers.log(req.request_id)["events"]
    assert res.t_first_ns >= written[1] > written[0]


def test_llama_server_timings_reach_the_result(servers):
    req = chat(10, delay_ms=1)
    res = run(servers.http, "replay/llamacpp_completion_stream.sse", req, adapter=get_adapter("llama-server"))
    assert res.ok
    assert res.server_timings["cache_n"] == 16 and res.server_timings["prompt_n"] == 26
    req = chat(10, delay_ms=1)
    res = run(servers.http, "replay/llamacpp_chat_stream.sse", req, adapter=get_adapter("openai-chat"))
    assert res.server_timings["predicted_n"] == 10


def test_sglang_latencies_reach_the_result(servers):
    req = chat(10, delay_ms=1)
    res = run(servers.http, "replay/sglang_generate_stream.sse", req, adapter=get_adapter("sglang"))
    assert res.server_timings == {"total_retractions": 0, "e2e_latency": pytest.approx(0.1934)}
