"""The web UI's LLM tabs from a real merged aggregate: the matrix's order, columns and figures, and
the verdict so far, which follows the final verdict's rule (checked against it on the same data).
"""

from __future__ import annotations

import random
import re
from types import SimpleNamespace

from analysis.hdr import percentile_values
from analysis.metric_registry import LIVE, metrics_for
from analysis.records import RequestRecord
from loadgen.engine.recorder import MetricsAggregate, Recorder
from loadgen.live.snapshot import RunSnapshot
from loadgen.live.verdict_so_far import (
    FAILED_REQUESTS,
    GENERATOR_SATURATED,
    PASSING,
    SLO_MISSED,
    WAITING,
    verdict_so_far,
)
from loadgen.live.webui import TAB_PERCENTILES, LiveView


def _record(i: int, rng: random.Random, *, ok: bool = True, lag_us: int = 200, ttft_us: int | None = None) -> RequestRecord:
    t_sched = i * 1000
    t_send = t_sched + lag_us
    t_first = t_send + (ttft_us if ttft_us is not None else rng.randint(10_000, 400_000))
    gaps = [rng.randint(5_000, 60_000) for _ in range(rng.randint(1, 20))]
    t_last = t_first + sum(gaps)
    return RequestRecord(
        request_id=f"r{i}", session_id=f"s{i // 2}", session_index=i // 2, turn_index=i % 2,
        turn_class="first" if i % 2 == 0 else "follow-up", tenant="default", target="sim", worker="w",
        status="ok" if ok else "error", t_sched_us=t_sched, t_send_us=t_send,
        t_first_us=t_first if ok else None, t_last_us=t_last if ok else None,
        t_end_us=t_last + 300 if ok else t_send + 50, output_tokens=len(gaps) + 1 if ok else 0,
        chunks=len(gaps) + 1 if ok else 0, itl_us=gaps if ok else [],
        error_category=None if ok else "http_5xx",
    )  # fmt: skip


def _aggregate(records: list[RequestRecord]) -> MetricsAggregate:
    rec = Recorder()
    for r in records:
        rec.record_request(r)
    agg = MetricsAggregate()
    agg.merge(rec.take_delta())
    return agg


def _view(agg: MetricsAggregate, slos: list[str] | None = None, bound_us: int = 10_000) -> LiveView:
    cfg = SimpleNamespace(run_id="r", mode="open", slos=slos or [], max_schedule_lag_us=bound_us)
    return LiveView(lambda: RunSnapshot(config=cfg, aggregate=agg, t0_unix_s=1.0, t_end_unix_s=2.0))


def test_the_matrix_keeps_the_registry_order_with_every_percentile_and_separators() -> None:
    rng = random.Random(1)
    agg = _aggregate([_record(i, rng) for i in range(1500)])
    snap = _view(agg).snapshot()
    matrix = snap["matrix"]
    # TTFOT has no values (no reasoning here): no rows. The rest in the live view's order, each
    # with all turns first, then first and follow-up turns.
    names = [n for n in metrics_for(LIVE) if n != "ttfot"]
    assert [(r["metric"], r["turns"]) for r in matrix][:3] == [("TTFT", "all"), ("TTFT", "first"), ("TTFT", "follow-up")]
    assert len(matrix) == 3 * len(names)
    assert "name" not in matrix[0]  # Locust's table would sort by it, alphabetically
    assert set(matrix[0]) == {"metric", "turns", "count", "p50_ms", "p90_ms", "p95_ms", "p99_ms", "p99_9_ms"}
    ttft_all = matrix[0]
    assert ttft_all["count"] == "1,500"
    for p, key in zip(TAB_PERCENTILES, ("p50_ms", "p90_ms", "p95_ms", "p99_ms", "p99_9_ms"), strict=True):
        want = percentile_values(agg.combined("ttft"), (p,))[0] / 1000.0
        assert ttft_all[key] == f"{round(want, 2):,.2f}", key
        assert re.fullmatch(r"\d{1,3}(,\d{3})*\.\d\d", ttft_all[key])
    row = next(r for r in snap["percentiles"] if (r["name"], r["turn_class"]) == ("ttft", "all"))
    assert row["count"] == 1500 and row["p99_9_ms"] == round(percentile_values(agg.combined("ttft"), (99.9,))[0] / 1000, 2)


def test_the_verdict_so_far_says_passing_and_each_slo() -> None:
    rng = random.Random(2)
    agg = _aggregate([_record(i, rng, ttft_us=100_000) for i in range(50)])
    snap = _view(agg, slos=["ttft_p99=500ms", "e2e_p50=1ms"]).snapshot()
    run = {r["key"]: r["value"] for r in snap["run"]}
    assert snap["verdict"]["state"] == SLO_MISSED and snap["verdict"]["exit_code"] == 3
    assert run["SLO ttft_p99=500ms"].endswith("(passing)")
    assert run["SLO e2e_p50=1ms"].endswith("(failing)")
    assert run["verdict so far"].startswith("SLO missed so far: e2e_p50=1ms")
    assert run["generator"].startswith("healthy: schedule lag p99")
    assert [r["key"] for r in snap["run"]][:1] == ["verdict so far"]


def test_the_verdict_so_far_takes_the_final_rule_in_its_order() -> None:
    rng = random.Random(3)
    healthy = [_record(i, rng) for i in range(40)]
    assert verdict_so_far(_aggregate([]), [], 10_000).state == WAITING
    assert verdict_so_far(_aggregate(healthy), [], 10_000).state == PASSING
    failing = [*healthy, _record(99, rng, ok=False)]
    v = verdict_so_far(_aggregate(failing), [], 10_000)
    assert v.state == FAILED_REQUESTS and v.text == "1 of 41 requests failed so far (http_5xx 1)"
    # Saturation comes first, as at the end: a late generator's latencies are not the server's.
    late = [_record(i, rng, lag_us=50_000, ok=i != 3) for i in range(40)]
    v = verdict_so_far(_aggregate(late), ["ttft_p99=1ms"], 10_000)
    assert v.state == GENERATOR_SATURATED and v.exit_code == 4 and "schedule lag p99" in v.text
    # SLOs before failures.
    v = verdict_so_far(_aggregate(failing), ["ttft_p50=1ms"], 10_000)
    assert v.state == SLO_MISSED


def test_the_final_verdict_agrees_on_the_same_numbers(tmp_path) -> None:
    """The runtime's verdict on a summary of the same requests gives the exit code the live one
    predicts (the live view must not say passing where the end says failed)."""
    from analysis.results import RunResults
    from analysis.summary import summarize_results
    from loadgen.runtime.verdict import verdict_from_summary

    rng = random.Random(4)
    cases = {
        "pass": ([_record(i, rng) for i in range(60)], []),
        "fail": ([_record(i, rng, ok=i % 7 != 0) for i in range(60)], []),
        "slo": ([_record(i, rng, ttft_us=300_000) for i in range(60)], ["ttft_p99=100ms"]),
    }
    for name, (records, slos) in cases.items():
        live = verdict_so_far(_aggregate(records), slos, 10_000)
        results = RunResults(path=tmp_path, info={"max_schedule_lag_us": 10_000}, records=records, hlog=None)
        summary = summarize_results(results, slos=",".join(slos) or [])
        final = verdict_from_summary(summary, slos, None)
        assert live.exit_code == final.exit_code, (name, live.text, final.reason)


def test_coalesced_reads_come_from_the_workers_counts_where_they_reported_them() -> None:
    """The workers count reads that carried two token chunks (what the final verdict reads); the
    histograms' estimate is only the fallback."""
    rng = random.Random(5)
    agg = _aggregate([_record(i, rng) for i in range(40)])
    assert verdict_so_far(agg, [], 10_000).generator.coalesced_share == 0.0
    v = verdict_so_far(agg, [], 10_000, coalescing=(30, 100))
    assert v.generator.coalesced_share == 0.3 and v.state == GENERATOR_SATURATED
    assert verdict_so_far(agg, [], 10_000, coalescing=(1, 100)).state == PASSING
    assert verdict_so_far(agg, [], 10_000, coalescing=(0, 0)).generator.coalesced_share == 0.0


def test_the_banner_leads_with_the_verdict_so_far_then_the_runs_own() -> None:
    rng = random.Random(6)
    agg = _aggregate([_record(i, rng, ok=i != 5) for i in range(30)])
    cfg = SimpleNamespace(run_id="r7", mode="open", slos=["ttft_p99=10s"], max_schedule_lag_us=10_000)
    ended: list[float | None] = [None]
    view = LiveView(lambda: RunSnapshot(config=cfg, aggregate=agg, t0_unix_s=1.0, t_end_unix_s=ended[0], arrivals_planned=40))
    banner = view.banner()
    assert re.search(r'data-state="failed requests"[^>]*>1 of 30 requests failed so far \(http_5xx 1\)<', banner)
    assert re.search(r"<b>SLO ttft_p99=10s</b> [0-9.]+ms \(passing\)<", banner), banner
    figures = dict(re.findall(r"<b>([^<]+)</b> ([^<]+)<", banner))
    assert figures["sessions planned"] == "40" and figures["requests done"] == "30" and figures["http_5xx"] == "1"
    assert figures["generator"].startswith("healthy: schedule lag p99")
    ended[0] = 2.0
    view.run_ended("r7", "loadgen verdict: FAIL (exit 1): 1 of 30 requests failed (http_5xx 1)", 1, None)
    banner = view.banner()
    assert 'data-state="failed"' in banner and ">FAIL (exit 1): 1 of 30 requests failed (http_5xx 1)<" in banner
    assert "report" not in dict(re.findall(r"<b>([^<]+)</b> ([^<]+)<", banner))
