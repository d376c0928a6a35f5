"""vLLM's metric names on the sim's ``/metrics`` after a short load, checked against the truth log:
valid Prometheus exposition (prometheus_client's parser and the project's own), counters equal
to the sums over the requests, latency histograms whose counts and sums are the truth's, and
preemptions under a KV pool too small for the batch."""

from __future__ import annotations

import asyncio
from dataclasses import asdict

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from targets.scrape import parse_text, summarize
from targets.sim.process import SimProcess
from targets.sim.profile import load_profile

from .runs import truth
from .test_sim_server import get_json, stream

N = 10
# 32 blocks of 16 tokens; ten 64-token prompts with 48-token replies need 7 blocks each: the batch
# outgrows the pool and the newest requests are preempted. Replies stop at a drawn length often.
PROFILE = {
    "kv_capacity_tokens": 512, "max_model_len": 512, "preemption": True,
    "eos_lengths": {"dist": "uniform", "low": 20, "high": 70},
}  # fmt: skip


async def _load(url: str) -> None:
    bodies = [
        {"messages": [{"role": "user", "content": f"job {i} " + "read the file " * 20}], "max_tokens": 48,
         "stream": True, "stream_options": {"include_usage": True}}
        for i in range(N)
    ]  # fmt: skip
    results = await asyncio.gather(
        *(stream(url, "/v1/chat/completions", b, {"X-Request-ID": f"m{i}"}) for i, b in enumerate(bodies))
    )
    assert all(r.status == 200 and not r.error for r in results)


def test_vllm_metrics_match_the_truth(tmp_path) -> None:
    base = {k: v for k, v in asdict(load_profile("tiny")).items() if k not in ("eos_lengths", "preemption")}
    path = tmp_path / "small-kv.json"
    path.write_bytes(orjson.dumps({**base, **PROFILE}))
    log = tmp_path / "truth.jsonl"
    sim = SimProcess.start(
        ["--profile", str(path), "--time-scale", "1", "--seed", "2", "--truth-log", str(log)]
    )
    try:
        asyncio.run(_load(sim.url))
        status, page = asyncio.run(get_json(sim.url, "/metrics"))
    finally:
        sim.stop()
    assert status == 200
    families = {f.name: f for f in text_string_to_metric_families(page)}  # raises on invalid exposition
    m = parse_text(page)
    assert m.invalid_lines == 0
    recs = list(truth(log).values())
    assert len(recs) == N and all(r["outcome"] == "ok" for r in recs)

    def v(name: str, **labels: str) -> float:
        samples = m.samples(name, **labels)
        assert samples and all(s.label("model_name") == "sim-tiny" for s in samples), name
        return sum(s.value for s in samples)

    assert v("vllm:prompt_tokens_total") == sum(r["prompt_tokens"] for r in recs)
    assert v("vllm:generation_tokens_total") == sum(r["completion_tokens"] for r in recs)
    for reason in ("stop", "length"):
        assert v("vllm:request_success_total", finished_reason=reason) == sum(
            r["finish_reason"] == reason for r in recs
        )
    assert v("vllm:request_success_total", finished_reason="stop") > 0
    assert v("vllm:num_preemptions_total") == sum(r["preemptions"] for r in recs) > 0
    for name in ("prefix_cache_queries_total", "prefix_cache_hits_total"):  # recomputes look up again
        assert v(f"vllm:{name}") == v(f"sim:{name}")
    assert v("vllm:prefix_cache_hits_total") >= sum(r["cached_tokens"] for r in recs)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert v(name) == 0 and families[name].type == "gauge"

    ttft_s = [(r["t_first_token_ns"] - r["t_received_ns"]) / 1e9 for r in recs]
    gaps_s = [
        (b - a) / 1e9 for r in recs for a, b in zip(r["t_chunks_ns"], r["t_chunks_ns"][1:], strict=False)
    ]
    e2e_s = [(r["t_end_ns"] - r["t_received_ns"]) / 1e9 for r in recs]
    for name, values in (
        ("vllm:time_to_first_token_seconds", ttft_s),
        ("vllm:inter_token_latency_seconds", gaps_s),
        ("vllm:e2e_request_latency_seconds", e2e_s),
        # the engine's phases, virtual seconds at time-scale 1
        ("vllm:request_queue_time_seconds", [r["queue_s"] for r in recs]),
        ("vllm:request_prefill_time_seconds", [r["prefill_s"] for r in recs]),
        ("vllm:request_decode_time_seconds", [r["decode_s"] for r in recs]),
        ("vllm:request_inference_time_seconds", [r["prefill_s"] + r["decode_s"] for r in recs]),
        ("vllm:request_prompt_tokens", [r["prompt_tokens"] for r in recs]),
        ("vllm:request_generation_tokens", [r["completion_tokens"] for r in recs]),
    ):
        h = m.histogram(name, model_name="sim-tiny")
        assert families[name].type == "histogram"
        assert h.count == len(values) and h.sum == pytest.approx(sum(values), rel=1e-9), name
    # (A preempted request's stall in its token times: tests/unit/test_sim_preemption.py, on the
    # engine's own clock; here a stall can be as short as two steps, within a busy machine's noise.)
    picks = summarize(m)
    assert picks["engine"] == "sim" and picks["preemptions"] == v("vllm:num_preemptions_total")
    assert picks["mean_ttft_s"] == pytest.approx(sum(ttft_s) / N, rel=1e-9)
