"""Each fault flag of the sim produces its fault on a real stream, and the truth record names it."""

from __future__ import annotations

import itertools

import orjson
import pytest

from tests.integration.test_sim_server import USER, SimFactory, chat_body, get_json, run, stream


@pytest.fixture
def sims():
    """``sims(*flags)`` starts a sim; all are stopped when the test ends."""
    factory = SimFactory()
    try:
        yield factory
    finally:
        factory.finish()


N = 12  # tokens per request; mid-stream faults hit before token N // 2


def request(sim, rid, max_tokens=N, stream_=True):
    body = chat_body(USER, max_tokens, stream=stream_)
    res = run(stream(sim.url, "/v1/chat/completions", body, {"X-Request-ID": rid}))
    truth = run(get_json(sim.url, f"/sim/requests/{rid}"))[1]
    return res, truth


def test_http_500(sims):
    sim = sims("--profile", "tiny", "--time-scale", "0", "--fault-http-500", "1")
    res, truth = request(sim, "f500")
    assert res.status == 500 and orjson.loads(res.body)["error"]["code"] == 500
    assert truth["fault"] == "http_500" and truth["status"] == 500 and truth["outcome"] == "fault"


def test_http_429(sims):
    sim = sims("--profile", "tiny", "--time-scale", "0", "--fault-http-429", "1")
    res, truth = request(sim, "f429")
    assert res.status == 429 and res.headers["Retry-After"] == "1"
    assert truth["fault"] == "http_429" and truth["status"] == 429


def test_cut_closes_the_stream_without_done(sims):
    sim = sims("--profile", "tiny", "--time-scale", "1", "--fault-cut", "1")
    res, truth = request(sim, "fcut")
    assert res.status == 200
    assert not res.done and res.error is not None  # the client saw an incomplete body
    assert len(res.content_chunks) == N // 2
    assert truth["fault"] == "cut" and truth["fault_token_index"] == N // 2
    assert truth["completion_tokens"] == N // 2 == len(truth["t_chunks_ns"])
    # the engine dropped the request: nothing left running
    metrics = run(get_json(sim.url, "/metrics"))[1]
    assert 'sim:num_requests_running{model_name="sim-tiny"} 0' in metrics


def test_stall_pauses_mid_stream_then_finishes(sims):
    sim = sims("--profile", "tiny", "--time-scale", "1", "--fault-stall", "1", "--stall-s", "0.4")
    res, truth = request(sim, "fstall")
    assert res.done and len(res.content_chunks) == N
    times = [t for t, _ in res.content_chunks]
    gaps = [(b - a) / 1e9 for a, b in itertools.pairwise(times)]
    k = N // 2
    assert gaps[k - 1] >= 0.4  # between token k-1 and token k
    assert max(gaps[: k - 1] + gaps[k:]) < 0.2
    assert truth["fault"] == "stall" and truth["fault_token_index"] == k
    t = truth["t_chunks_ns"]
    assert (t[k] - t[k - 1]) / 1e9 >= 0.4


def test_malformed_chunk_mid_stream(sims):
    sim = sims("--profile", "tiny", "--time-scale", "0", "--fault-malformed", "1")
    res, truth = request(sim, "fbad")
    assert res.done and len(res.content_chunks) == N
    assert len(res.bad_lines) == 1
    assert truth["fault"] == "malformed" and truth["fault_token_index"] == N // 2


def test_faults_on_non_streaming_requests(sims):
    sim = sims("--profile", "tiny", "--time-scale", "0", "--fault-malformed", "1")
    res, truth = request(sim, "nsbad", stream_=False)
    assert res.status == 200 and truth["fault"] == "malformed"
    try:
        orjson.loads(res.body)
        raise AssertionError("expected a non-JSON body")
    except orjson.JSONDecodeError:
        pass


def test_fault_draws_are_seeded(sims):
    """Same seed, same order of requests: the same requests fail."""
    patterns = []
    for _ in range(2):
        sim = sims("--profile", "tiny", "--time-scale", "0", "--seed", "5", "--fault-http-500", "0.5")
        statuses = [request(sim, f"s{i}", max_tokens=2)[0].status for i in range(16)]
        patterns.append(statuses)
    assert patterns[0] == patterns[1]
    assert {200, 500} == set(patterns[0])
