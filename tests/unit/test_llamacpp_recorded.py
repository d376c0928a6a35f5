"""What the real llama-server sent (tests/fixtures/llamacpp/, recorded by the launcher tests from
the cached build and SmolLM2), read by the adapters and the identity check.

Both ways of talking to llama-server, the native ``/completion`` (``llama-server`` adapter) and
``/v1/chat/completions`` (``openai-chat``), must end in the same record fields: a token per
token-bearing chunk, usage with the prompt split into evaluated and cached tokens, and the
engine's ``timings`` as ``server_timings``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from targets.adapters.base import StreamEvent, Usage
from targets.errors import TargetError
from targets.identity import _identity_from, check_expected
from targets.registry import get_adapter

RECORDED = Path(__file__).resolve().parent.parent / "fixtures" / "llamacpp"
MODEL = "/root/.cache/loadgen/models/smollm2-135m-instruct-q4_1/SmolLM2-135M-Instruct.Q4_1.gguf"
TIMING_KEYS = {"cache_n", "prompt_n", "prompt_ms", "predicted_n", "predicted_ms"}


def parse(adapter: str, name: str) -> list[StreamEvent]:
    stream = get_adapter(adapter).new_stream()
    lines = (RECORDED / name).read_bytes().splitlines(keepends=True)
    return [e for e in (stream.parse_line(line) for line in lines) if e is not None]


def test_native_completion_cold_then_cached():
    cold, cached = (
        parse("llama-server", "completion_stream_cold.sse"),
        parse("llama-server", "completion_stream_cached.sse"),
    )
    for events in (cold, cached):
        assert [e.tokens for e in events] == [1] * 8 + [0]
        assert events[-1].done and not any(e.done for e in events[:-1])
        assert set(events[-1].server_timings) >= TIMING_KEYS
    assert "".join(e.text for e in cold) == "".join(e.text for e in cached)  # same prompt, greedy
    assert cold[-1].usage == Usage(prompt_tokens=1109, completion_tokens=8, cached_tokens=0)
    assert cached[-1].usage == Usage(prompt_tokens=1109, completion_tokens=8, cached_tokens=1108)
    t_cold, t_cached = cold[-1].server_timings, cached[-1].server_timings
    # usage's prompt = evaluated + cached tokens; the cache turns seconds of prefill into ms
    assert (t_cold["prompt_n"], t_cold["cache_n"]) == (1109, 0)
    assert (t_cached["prompt_n"], t_cached["cache_n"]) == (1, 1108)
    assert t_cold["prompt_ms"] > 100 * t_cached["prompt_ms"]


def test_chat_stream_gives_the_same_fields():
    events = parse("openai-chat", "chat_stream.sse")
    assert events[0].tokens == 0 and events[0].text == ""  # role-only: not the first token
    assert sum(e.tokens for e in events) == 12
    usage = [e.usage for e in events if e.usage]
    assert usage == [Usage(prompt_tokens=27, completion_tokens=12, cached_tokens=0)]
    (timings,) = [e.server_timings for e in events if e.server_timings]
    assert set(timings) >= TIMING_KEYS
    assert (timings["prompt_n"] + timings["cache_n"], timings["predicted_n"]) == (27, 12)
    assert events[-1].done


def test_identity_from_props_and_models():
    docs = {
        p: json.loads((RECORDED / f).read_text())
        for p, f in (("/props", "props.json"), ("/v1/models", "models.json"))
    }
    ident = _identity_from("http://127.0.0.1:8080", "llama-server", docs, {})
    assert (ident["engine"], ident["model"], ident["model_path"]) == ("llama.cpp", MODEL, MODEL)
    assert (ident["build"], ident["total_slots"]) == ("b1-0c1e570", 2)
    check_expected(
        ident, {"model": "SmolLM2-135M-Instruct.Q4_1.gguf", "engine": "llama-server", "build": "0c1e570"}
    )
    with pytest.raises(TargetError) as info:
        check_expected(ident, {"model": "qwen2.5-7b.gguf"})
    assert (
        str(info.value)
        == f"target http://127.0.0.1:8080: expected model 'qwen2.5-7b.gguf' but the server serves '{MODEL}'"
    )
