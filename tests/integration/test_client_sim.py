"""The client, preflight, identity and scrape against the simulated engine (a real subprocess).

The sim records, per request, when it wrote each token chunk (``perf_counter_ns``, the same
system-wide clock); the client's timestamps must match them within a few ms. A two-turn
session over one connection must hit the prefix cache on its second turn, and the sim's
``/metrics`` must show it.
"""

from __future__ import annotations

import json
import urllib.request

import pytest

from loadgen.engine.client import SessionConnection
from loadgen.engine.preflight import preflight
from targets.adapters.base import ChatRequest
from targets.identity import check_expected, read_identity
from targets.registry import get_adapter
from targets.scrape import diff, prefix_cache_hit_rate, scrape
from targets.sim.process import SimProcess
from tests.integration.test_client_stream import assert_on_time


@pytest.fixture(scope="module")
def sim():
    # tiny profile at 10x: ~15 ms per decode step, so token gaps dwarf scheduling noise.
    proc = SimProcess.start(["--profile", "tiny", "--time-scale", "10"])
    yield proc
    proc.stop()


def truth(sim, request_id: str) -> dict:
    with urllib.request.urlopen(f"{sim.url}/sim/requests/{request_id}", timeout=5) as r:
        return json.loads(r.read())


def test_session_over_one_connection_matches_the_sims_truth(sim):
    adapter = get_adapter("openai-chat")
    messages = [
        {"role": "system", "content": "You are a coding agent. " + "Read the files first. " * 40},
        {"role": "user", "content": "list the files in the repo"},
    ]
    results = []
    with SessionConnection(sim.url) as conn:
        for turn in range(2):
            req = ChatRequest(
                messages=list(messages), max_tokens=12, session_id="s-1", request_id=f"sim-t{turn}"
            )
            res = conn.stream(adapter.build_request(req), adapter, deadline_s=20)
            assert res.ok, res.error_message
            results.append(res)
            messages += [
                {"role": "assistant", "content": res.text},
                {"role": "user", "content": "now run the tests"},
            ]
        assert conn.connections_opened == 1
    for turn, res in enumerate(results):
        t = truth(sim, f"sim-t{turn}")
        assert res.usage.completion_tokens == t["completion_tokens"] == 12
        assert res.usage.prompt_tokens == t["prompt_tokens"]
        assert res.usage.cached_tokens == t["cached_tokens"]
        assert res.chunk_tokens == [1] * 12
        assert_on_time(res.chunk_ns, t["t_chunks_ns"])
        assert res.t_first_ns - t["t_first_token_ns"] >= 0
    assert results[1].usage.cached_tokens > 0  # the second turn extends the first: a cache hit


def test_preflight_identity_and_metrics(sim):
    adapter = get_adapter("openai-chat")
    info = preflight(sim.url, adapter, timeout_s=10)
    assert info["tokens"] >= 1
    ident = read_identity(sim.url, "openai-chat", timeout_s=5)
    assert ident["engine"] == "sim" and ident["model"] == "sim-tiny"
    check_expected(ident, {"model": "sim-tiny", "engine": "sim"})

    before = scrape(f"{sim.url}/metrics", 5)
    prompt = [{"role": "user", "content": "same prefix every time " * 30}]
    with SessionConnection(sim.url) as conn:
        for i in range(3):
            req = ChatRequest(messages=prompt, max_tokens=2, session_id="s-m", request_id=f"sim-m{i}")
            assert conn.stream(adapter.build_request(req), adapter, deadline_s=20).ok
    window = diff(before, scrape(f"{sim.url}/metrics", 5))
    assert window.value("sim:generation_tokens_total") == 6
    assert 0.5 < prefix_cache_hit_rate(window) < 1.0  # later requests reuse the first one's blocks
