"""What `loadgen run` measures, checked against what the simulated engine actually did.

Margins, with >= 100 concurrent streams: per-gap ITL errors p99 <= 2 ms; per-request TTFT errors
p50 <= 1 ms; and each end of the TTFT interval on its own: the client's first-token stamp within
2 ms (p99) of the sim's write of that chunk, its send stamp never after the sim's handler started
(0.5 ms of slack). The sim stamps a chunk right before its socket write and a request when its
handler starts, on the same monotonic clock as the client. The run uses the H200 profile slowed
10x so that 100+ streams stay within what two shared cores serve without saturating.

Why not a p99 of the whole TTFT error: the sim's handler starts after its own accept loop has
read the request, and with 200+ streams on two shared cores that queue alone reaches 1-5 ms at
p99. The client rightly counts it as TTFT, so the interval's tail compares two different
things; the ends are compared one by one instead, each against the sim's own stamp.

Arrivals are open loop on purpose: 100 agents connecting in the same millisecond queue in the
sim's own accept loop for ~15 ms before its handler (and so its truth clock) starts.
"""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from analysis.hlog import clamp_us, new_histogram, read_histograms
from analysis.records import histogram_tag, metric_values

from .runs import loadgen, percentile, records, run_dir, sim, truth

pytestmark = pytest.mark.slow


def test_client_ttft_and_itl_match_the_sims_truth_with_100_concurrent_streams(tmp_path, capsys) -> None:
    results = tmp_path / "results"
    with sim(tmp_path, "--profile", "h200-llama3-8b-fp8", "--time-scale", "10", "--seed", "3") as (proc, truth_log):
        # Open loop at 60 sessions/s: each session streams for ~2-4 s, so well over 100 streams
        # are in flight, and the sim's batch emits a chunk for every one of them at each step.
        r = loadgen(
            "run", "--target", proc.url, "--workload", "tiny", "--rate", "60",
            "--num-sessions", "240", "--seed", "3", "--results", str(results),
        )  # fmt: skip
        assert r.returncode == 0, r.stderr[-3000:]
    recs = records(run_dir(results))
    t = truth(truth_log)
    assert len(recs) >= 400 and all(rec.ok for rec in recs)

    # Concurrency really reached 100: the sim saw >= 100 requests overlapping at some instant.
    events = sorted([(v["t_received_ns"], 1) for v in t.values()] + [(v["t_end_ns"], -1) for v in t.values()])
    level = peak = 0
    for _, d in events:
        level += d
        peak = max(peak, level)
    assert peak >= 100, peak

    # --connections pooled (the default): each session held one connection for all its turns,
    # and a finished session's connection carried later ones, so the server saw fewer
    # connections than sessions, and no more than sessions were ever alive at once. A session
    # holds its connection from its start, up to 20 ms (its lead) before its first turn, to its
    # last reply's end, also while it thinks (when the server sees nothing of it).
    ports: dict[str, set[int]] = {}
    spans: dict[str, tuple[int, int]] = {}
    for rec in recs:
        ports.setdefault(rec.session_id, set()).add(t[rec.request_id]["client_port"])
        a, b = spans.get(rec.session_id, (rec.t_sched_us, rec.t_end_us))
        spans[rec.session_id] = (min(a, rec.t_sched_us), max(b, rec.t_end_us))
    alive = sorted([(a - 30_000, 1) for a, _ in spans.values()] + [(b + 5_000, -1) for _, b in spans.values()])
    level = alive_peak = 0
    for _, d in alive:
        level += d
        alive_peak = max(alive_peak, level)
    assert all(len(p) == 1 for p in ports.values()), ports
    connections = len(set().union(*ports.values()))
    assert connections <= alive_peak and connections < len(ports), (connections, alive_peak, len(ports))
    # run.json counts them as the server saw them: every connect, and every session that took one.
    counted = orjson.loads((run_dir(results) / "run.json").read_bytes())["connections"]
    assert counted == {"mode": "pooled", "opened": connections, "handed_on": len(ports) - connections}, counted

    ttft_err_ms, itl_err_ms = [], []
    # Record times are µs since the run start on the worker's perf_counter; the sim's are that
    # same clock's ns. One offset per worker maps one onto the other: the median of (sim write of
    # the first token - client stamp of it), so the per-request deviations below are delivery
    # jitter plus stamping error. A constant stamping lag hides in the offset but not in the
    # TTFT median, which is checked on the raw intervals.
    offset_us: dict[str, float] = {}
    for worker in {rec.worker for rec in recs}:
        mine = [rec for rec in recs if rec.worker == worker]
        offset_us[worker] = float(np.median([t[r.request_id]["t_first_token_ns"] / 1000 - r.t_first_us for r in mine]))
    first_dev_ms, send_lead_ms = [], []
    for rec in recs:
        tr = t[rec.request_id]
        sim_ttft_us = (tr["t_first_token_ns"] - tr["t_received_ns"]) / 1000
        ttft_err_ms.append(abs(rec.ttft_us - sim_ttft_us) / 1000)
        off = offset_us[rec.worker]
        first_dev_ms.append(abs(rec.t_first_us + off - tr["t_first_token_ns"] / 1000) / 1000)
        # How long before the sim's handler started the client says it sent (>= 0 if causal).
        send_lead_ms.append((tr["t_received_ns"] / 1000 - (rec.t_send_us + off)) / 1000)
        sim_gaps = np.diff(np.asarray(tr["t_chunks_ns"], dtype=np.int64)) / 1000
        assert len(sim_gaps) == len(rec.itl_us), rec.request_id
        itl_err_ms.extend((np.abs(np.asarray(rec.itl_us) - sim_gaps) / 1000).tolist())
        assert rec.output_tokens == tr["completion_tokens"] == rec.max_tokens
        assert rec.prompt_tokens == tr["prompt_tokens"] and rec.cached_tokens == tr["cached_tokens"]
    ttft_p50, itl_p99 = percentile(ttft_err_ms, 50), percentile(itl_err_ms, 99)
    first_p99 = percentile(first_dev_ms, 99)
    with capsys.disabled():
        print(
            f"\n[ground truth] {len(recs)} requests, peak concurrency {peak}: |TTFT err| p50 "
            f"{ttft_p50:.3f} ms p99 {percentile(ttft_err_ms, 99):.3f} ms; first-token stamp vs sim "
            f"write p99 {first_p99:.3f} ms; send before sim handler p50 {percentile(send_lead_ms, 50):.3f} "
            f"ms min {min(send_lead_ms):.3f} ms p99 {percentile(send_lead_ms, 99):.3f} ms; |ITL err| p50 "
            f"{percentile(itl_err_ms, 50):.3f} ms p99 {itl_p99:.3f} ms over {len(itl_err_ms)} gaps"
        )
    assert ttft_p50 <= 1.0
    assert first_p99 <= 2.0
    # The send stamp is taken before the request is written, so the sim cannot have started on it
    # earlier; 0.5 ms covers the offset's own uncertainty (the median delivery it absorbed).
    assert min(send_lead_ms) >= -0.5, min(send_lead_ms)
    assert itl_p99 <= 2.0


def test_recorded_histograms_equal_an_independent_computation_from_requests_jsonl(tmp_path) -> None:
    results = tmp_path / "results"
    with sim(tmp_path, "--profile", "tiny", "--time-scale", "1", "--seed", "5") as (proc, _):
        r = loadgen(
            "run", "--target", proc.url, "--workload", "tiny", "--rate", "20",
            "--num-sessions", "60", "--seed", "5", "--results", str(results),
        )  # fmt: skip
        # This checks the bookkeeping (histograms against records), which no timing changes: on a
        # loaded host the run may rightly say the generator was saturated (exit 4, its lag or its
        # coalesced reads over the bound), and what is compared below holds all the same.
        assert r.returncode in (0, 4), r.stderr[-3000:]
        if r.returncode == 4:
            assert "generator saturated" in r.stdout + r.stderr, r.stderr[-3000:]
    d = run_dir(results)
    recs = records(d)
    hists = read_histograms(d / "metrics.hlog")

    # TPOT and ITL computed here from the raw record fields, not through the record's helpers.
    for metric in ("tpot", "itl"):
        for tc in ("first", "follow-up"):
            mine = new_histogram()
            for rec in recs:
                if rec.turn_class != tc or rec.status != "ok":
                    continue
                if metric == "tpot" and rec.output_tokens >= 2:
                    mine.record_value(clamp_us(round((rec.t_last_us - rec.t_first_us) / (rec.output_tokens - 1))))
                if metric == "itl":
                    for gap in rec.itl_us:
                        mine.record_value(clamp_us(gap))
            tag = histogram_tag(metric, tc, "default", recs[0].target)
            assert mine.get_total_count() > 0
            assert list(hists[tag].counts) == list(mine.counts), tag
            assert sum(len(rec.itl_us) for rec in recs if rec.turn_class == tc) == hists[
                histogram_tag("itl", tc, "default", recs[0].target)
            ].get_total_count()

    # And every metric's histogram is exactly the rebuild from the records.
    rebuilt: dict = {}
    for rec in recs:
        for metric, value in metric_values(rec):
            h = rebuilt.setdefault(histogram_tag(metric, rec.turn_class, rec.tenant, rec.target), new_histogram())
            h.record_value(clamp_us(value))
    assert set(rebuilt) == set(hists)
    for tag, h in rebuilt.items():
        assert list(hists[tag].counts) == list(h.counts), tag
