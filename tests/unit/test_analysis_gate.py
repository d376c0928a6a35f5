"""The gate: noise passes, a real regression fails, SLOs and trustworthiness are checked."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.gate import gate, parse_max_regression
from tests.fixtures.results.synth import record, write_run


def _records(*, slowdown=1.0, noise_seed=0, sessions=150, lag_ms=0.0, errors=0):
    base_rng = np.random.default_rng(9)  # the same sessions every run
    noise = np.random.default_rng(noise_seed)
    out = []
    for s in range(sessions):
        base = base_rng.lognormal(5, 0.5)
        for t in range(2):
            ttft = base * slowdown * np.exp(0.1 * noise.standard_normal())
            out.append(
                record(s, t, sched_ms=s * 50 + t * 2000, lag_ms=lag_ms, ttft_ms=ttft, itl_ms=[20.0] * 5)
            )
    for k in range(errors):
        out.append(record(1000 + k, 0, sched_ms=k * 10, error="http_5xx"))
    return out


@pytest.fixture
def baseline(tmp_path):
    return write_run(tmp_path / "base", _records(), run_id="base", duration_s=12)


def test_noise_passes(tmp_path, baseline):
    run = write_run(tmp_path / "run", _records(noise_seed=1), run_id="run", duration_s=12)
    result = gate(
        run, baseline, {"ttft_p95": 0.10, "ttft_p50": "10%", "ttft_mean@follow-up": 0.1}, n_boot=400
    )
    assert result.ok and bool(result) and result.reasons == []
    assert any(c.startswith("pass  ttft_p95 within 1.10") for c in result.checks), result.checks


def test_a_real_regression_fails(tmp_path, baseline):
    run = write_run(tmp_path / "run", _records(slowdown=1.3, noise_seed=1), run_id="run", duration_s=12)
    result = gate(run, baseline, {"ttft_p50": 0.10, "itl_p95": 0.10}, n_boot=400)
    assert not result.ok
    assert len(result.reasons) == 1 and result.reasons[0].startswith("ttft_p50 regressed: 1.2"), (
        result.reasons
    )
    lo, hi = next(r for r in result.comparison["rows"] if r["metric"] == "ttft" and r["stat"] == "p50")[
        "ratio_ci"
    ]
    assert 1.1 < lo < 1.3 < hi
    assert "over the 1.10\u00d7 allowed" in result.reasons[0] and "\n" not in result.reasons[0]


def test_a_regression_within_tolerance_passes(tmp_path, baseline):
    run = write_run(tmp_path / "run", _records(slowdown=1.05, noise_seed=1), run_id="run", duration_s=12)
    assert gate(run, baseline, {"ttft_p50": 0.10}, n_boot=400).ok


def test_slos_attainment_and_errors(tmp_path):
    run = write_run(tmp_path / "run", _records(errors=10), duration_s=12)
    result = gate(run, slos="ttft_p99=50ms,ttft=1s", min_attainment=0.99, max_error_rate=0.01)
    assert not result.ok
    assert [r.split(":")[0] for r in result.reasons] == [
        "SLO ttft_p99=50ms missed",
        "SLO attainment 96.8% is under the 99.0% required",
        "error rate 3.23% (at most 1.00% allowed)",
    ]
    assert gate(run, slos="ttft_p99=5s").ok


def test_untrustworthy_runs_fail(tmp_path):
    partial = write_run(tmp_path / "p", _records(), status="running")
    assert gate(partial).reasons[0].startswith("run is partial")
    saturated = write_run(tmp_path / "s", _records(lag_ms=40))
    assert gate(saturated).reasons[0].startswith("generator saturated: schedule lag p99 40")


def test_bad_keys_are_one_line():
    assert parse_max_regression({"ttft_p99": 0.1, "itl_p99.9@follow-up": "5%"}) == {
        ("ttft", "p99", "all"): 0.1,
        ("itl", "p99.9", "follow-up"): 0.05,
    }
    with pytest.raises(ValueError, match=r"'latency_p99' is not metric_stat\[@turn_class\]"):
        parse_max_regression({"latency_p99": 0.1})
    with pytest.raises(ValueError, match="is not a tolerance"):
        parse_max_regression({"ttft_p99": "a lot"})
    with pytest.raises(ValueError, match="needs a baseline"):
        gate("unused", None, {"ttft_p99": 0.1})


def test_a_ratio_over_the_tolerance_that_noise_explains_passes_and_says_so(tmp_path, baseline):
    # 15% slower sessions: p95 comes out 11% over at the point estimate, but a 10% tolerance is
    # still inside its interval, so the regression is not shown.
    run = write_run(tmp_path / "run", _records(slowdown=1.15, noise_seed=1), run_id="run", duration_s=12)
    result = gate(run, baseline, {"ttft_p95": 0.10}, n_boot=400)
    row = result.comparison["rows"]
    row = next(r for r in row if (r["metric"], r["stat"], r["turn_class"]) == ("ttft", "p95", "all"))
    assert row["ratio"] > 1.10 and row["ratio_ci"][0] < 1.10
    assert result.ok
    assert any(c.startswith("pass  ttft_p95 not shown over 1.10\u00d7") for c in result.checks), result.checks


def test_a_percentile_with_too_few_values_beyond_it_fails_every_time(tmp_path, baseline):
    # 300 requests put 3 beyond p99: a p99 gate would pass or fail by which 3 requests were slow.
    run = write_run(tmp_path / "run", _records(noise_seed=1), run_id="run", duration_s=12)
    result = gate(run, baseline, {"ttft_p99": 0.10, "ttft_p95": 0.10}, n_boot=200)
    assert not result.ok
    assert result.reasons == [
        "ttft_p99: too few values beyond p99 to judge (3 of 300; p99 needs 1,000); gate a lower percentile or run longer"
    ]
