"""One percentile, whichever command prints it: compare's point estimates are summary.json's.

The hand-computed ``tiny`` run (tests/fixtures/results/tiny.py) has two measured first turns (TTFT
200 and 900 ms) and a warm-up: linear interpolation between raw records would say p50 550 ms, the
HDR histograms of the measured requests (what summary.json, the demo, the report and the gate
print) 200 ms.
"""

from __future__ import annotations

import shutil

import numpy as np
import orjson
import pytest
from hdrh.histogram import HdrHistogram

from analysis import hdr
from analysis.compare import METRICS, OPTIONAL_METRICS, compare_runs, find_row
from analysis.summary import summarize
from tests.fixtures.results.synth import record, write_run
from tests.fixtures.results.tiny import TINY_DIR


def _group(summary: dict, tc: str) -> dict:
    return summary["metrics"] if tc == "all" else summary["by_turn_class"][tc]["metrics"]


def _assert_rows_are_the_summaries(cmp: dict, sa: dict, sb: dict) -> int:
    checked = 0
    for metric in METRICS:
        for tc in ("all", "first", "follow-up"):
            for stat in ("p50", "p90", "p95", "p99", "mean"):
                row = find_row(cmp, metric, tc, stat)
                if row is None and metric in OPTIONAL_METRICS:
                    continue  # neither run has values of it (no reasoning fields): no rows
                for arm, s in (("a", sa), ("b", sb)):
                    want = (_group(s, tc).get(metric) or {}).get(stat)
                    assert row[arm] == want, (metric, tc, stat, arm, row[arm], want)  # bit for bit
                    checked += want is not None
    return checked


def test_compare_prints_the_summarys_percentiles(tmp_path):
    a = shutil.copytree(TINY_DIR, tmp_path / "a")
    b = shutil.copytree(TINY_DIR, tmp_path / "b")
    sa = summarize(a)
    assert sa["by_turn_class"]["first"]["metrics"]["ttft"]["p50"] == pytest.approx(200, abs=0.1)
    cmp = compare_runs(a, b, n_boot=100)
    assert (
        find_row(cmp, "ttft", "first", "p50")["a"] == sa["by_turn_class"]["first"]["metrics"]["ttft"]["p50"]
    )
    assert _assert_rows_are_the_summaries(cmp, sa, summarize(b)) > 50


def _records(scale: float, *, errors: int = 0) -> list:
    rng = np.random.default_rng(5)  # the same sessions in both runs
    out = []
    for s in range(60):
        base = rng.lognormal(5, 0.7)
        for t in range(3):
            ttft = base * (1.0 if t == 0 else 0.4 * scale)
            out.append(
                record(
                    s,
                    t,
                    sched_ms=500 + s * 80 + t * 1500,
                    ttft_ms=ttft,
                    itl_ms=list(rng.lognormal(3, 0.4, 6)),
                )
            )
    out += [record(100 + k, 0, sched_ms=700 + k * 50, error="http_5xx") for k in range(errors)]
    return out


def test_compare_and_summary_agree_with_warmup_and_errors_in_one_arm(tmp_path):
    # A: every request measured (histograms from metrics.hlog); B: a warm-up and failed requests
    # (histograms rebuilt from the measured records). Both print what their summary.json says.
    a = write_run(tmp_path / "a", _records(1.0), run_id="a", duration_s=20)
    b = write_run(tmp_path / "b", _records(0.5, errors=5), run_id="b", duration_s=20, warmup_s=2.0)
    sa, sb = summarize(a), summarize(b)
    assert (sa["histogram_source"], sb["histogram_source"]) == ("metrics.hlog", "requests.jsonl")
    cmp = compare_runs(a, b, n_boot=200)
    assert _assert_rows_are_the_summaries(cmp, sa, sb) > 100
    for row in cmp["rows"]:
        if row["delta_ci"] is not None:
            lo, hi = row["delta_ci"]
            assert lo - 1e-3 <= row["delta"] <= hi + 1e-3, row  # the interval holds the estimate printed
        if row["ratio_ci"] is not None and row["ratio"] is not None:
            lo, hi = row["ratio_ci"]
            assert lo - 1e-3 <= row["ratio"] <= hi + 1e-3, row
    # the CDFs plotted are the same histograms' (p50 of the plot = the table's)
    pts = np.asarray(cmp["cdf"]["ttft"]["first"]["a"])
    p50 = pts[np.searchsorted(pts[:, 1], 0.5), 0]
    assert p50 == pytest.approx(sa["by_turn_class"]["first"]["metrics"]["ttft"]["p50"], abs=1e-3)
    json_rows = orjson.loads(orjson.dumps(cmp))["rows"]
    assert json_rows == cmp["rows"]


def test_one_function_answers_for_every_live_view():
    h = HdrHistogram(1, 3_600_000_000, 3)
    for v in np.random.default_rng(1).lognormal(10, 1, 3000).astype(int):
        h.record_value(int(v))
    for p in (0.0, 50.0, 95.0, 99.0, 99.9, 100.0):
        assert hdr.value_at_percentile(h, p) == h.get_value_at_percentile(p)
    assert hdr.percentile_values(h, (50.0, 99.0)) == [
        h.get_value_at_percentile(50),
        h.get_value_at_percentile(99),
    ]
    assert hdr.value_at_percentile(HdrHistogram(1, 1000, 3), 50) == 0
