"""The report's plotted percentiles are loadgen's one percentile: an HDR histogram of the window's
values read with ``analysis.hdr`` (what summary.json says for the same requests), not linear
interpolation between raw records.

Four TTFTs of 100, 200, 300 and 1000 ms: interpolation would plot p50 250 ms and p99 979 ms; the
histogram says p50 is the highest value of 200 ms's bucket and p99 that of 1000 ms's.
"""

from __future__ import annotations

import numpy as np
import pytest

from analysis import hdr, hlog, timeseries
from analysis.results import load_results
from analysis.summary import summarize
from tests.fixtures.results.synth import record, write_run

TTFT_MS = [100.0, 200.0, 300.0, 1000.0]
END_MS = 5000.0  # every request finishes here, so one plotted window holds them all


def _records(turn: int = 0) -> list:
    return [
        record(i, turn, sched_ms=END_MS - ttft, ttft_ms=ttft, session_id=f"s{i}-{turn}")
        for i, ttft in enumerate(TTFT_MS)
    ]


def _hdr_ms(values_ms, percentiles) -> list[float]:
    h = hlog.record_clamped(hlog.new_histogram(), [round(v * 1000) for v in values_ms])
    return [hdr.value_at_percentile(h, p) / 1000.0 for p in percentiles]


def test_the_fixture_is_one_where_interpolation_and_the_histogram_disagree():
    interp = [float(np.percentile(TTFT_MS, p)) for p in (50, 99)]
    assert interp != pytest.approx(_hdr_ms(TTFT_MS, (50, 99)), abs=0.5)


@pytest.mark.parametrize("with_hlog", [False, True])
def test_a_windows_percentiles_are_the_histograms_and_the_summarys(tmp_path, with_hlog):
    # without metrics.hlog (a run killed before its first flush) the plot reads the records
    d = write_run(
        tmp_path / "run", _records(), with_hlog=with_hlog, status="complete" if with_hlog else "running"
    )
    res = load_results(d)
    assert (res.hlog is not None) == with_hlog
    ts = timeseries.interval_percentiles(res, "ttft", (50.0, 99.0))
    want = _hdr_ms(TTFT_MS, (50, 99))
    assert len(ts.t_s) == 1
    assert [ts.values["p50"][0], ts.values["p99"][0]] == want
    s = summarize(d)["metrics"]["ttft"]
    assert [s["p50"], s["p99"]] == pytest.approx(want, abs=1e-3)


def test_schedule_lag_from_the_records_is_the_histograms(tmp_path):
    lags = [0.2, 0.5, 3.0, 40.0]
    recs = [
        record(i, 0, sched_ms=END_MS - 100 - lag, ttft_ms=100, lag_ms=lag, session_id=f"s{i}")
        for i, lag in enumerate(lags)
    ]
    res = load_results(write_run(tmp_path / "run", recs, with_hlog=False, status="running"))
    ts = timeseries.interval_percentiles(res, "schedule_lag", (50.0, 99.0, 100.0))
    assert [ts.values[k][0] for k in ("p50", "p99", "p100")] == _hdr_ms(lags, (50, 99, 100))


def test_ttft_by_turn_is_the_histograms():
    recs = _records(0) + _records(1)[:3]
    ts = timeseries.ttft_by_turn(recs, (50.0, 90.0, 99.0))
    assert ts.t_s == [0.0, 1.0]
    for i, vals in enumerate((TTFT_MS, TTFT_MS[:3])):
        assert [ts.values[k][i] for k in ("p50", "p90", "p99")] == _hdr_ms(vals, (50, 90, 99))
    assert ts.values["count"] == [4.0, 3.0]
