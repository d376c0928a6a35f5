"""Sweep search on a synthetic, monotone latency model (no runs executed)."""

from __future__ import annotations

import pytest

from analysis.sweep import find_max_rate, format_sweep, grid

CAPACITY = 50.0  # requests/s at which the model's queue blows up


def model(rate: float) -> dict:
    """An M/M/1-like server: p99 TTFT = 100 ms / (1 - rate/capacity); errors past capacity."""
    load = rate / CAPACITY
    ttft_p99 = 100.0 / (1 - load) if load < 1 else 1e6
    return {
        "metrics": {
            "ttft": {"count": 1000, "p50": ttft_p99 / 4, "p90": ttft_p99 / 2, "p99": ttft_p99},
            "itl": {"count": 9000, "p50": 20.0, "p90": 25.0, "p99": 30.0},
        },
        "errors": {"rate": 0.0 if load < 1 else 0.5},
        "throughput": {
            "requests_per_s": min(rate, CAPACITY),
            "output_tokens_per_s": 100 * min(rate, CAPACITY),
        },
        "slo": {"goodput_requests_per_s": min(rate, CAPACITY)},
    }


SLOS = "ttft_p99=450ms,itl_p99=50ms"  # holds while 100/(1-r/50) <= 450, i.e. r <= 38.89
LIMIT = CAPACITY * (1 - 100 / 450)


def test_bisection_matches_a_dense_grid_within_one_step():
    step = 0.5
    dense = grid(model, SLOS, [step * k for k in range(1, 120)])
    assert dense.max_rate_per_s == 38.5
    found = find_max_rate(model, SLOS, 1.0, 100.0, tolerance=step)
    assert found.max_rate_per_s is not None
    assert abs(found.max_rate_per_s - dense.max_rate_per_s) <= step
    assert LIMIT - step <= found.max_rate_per_s <= LIMIT  # never a rate that was not seen to hold
    assert all(p.ok == (p.rate_per_s <= LIMIT) for p in found.points)
    assert len(found.points) <= 2 + 8  # log2(99 / 0.5) halvings after both ends


def test_steps_bound_the_bracket():
    found = find_max_rate(model, SLOS, 10.0, 74.0, steps=4)  # bracket 64 -> 4
    assert len(found.points) == 6
    assert found.max_rate_per_s == 38.0
    assert found.notes == ["the limit lies in [38, 42]/s"]


def test_ends_that_already_decide():
    assert find_max_rate(model, SLOS, 45.0, 60.0).max_rate_per_s is None
    top = find_max_rate(model, SLOS, 1.0, 30.0)
    assert top.max_rate_per_s == 30.0 and "raise hi" in top.notes[0]


def test_errors_fail_a_rate_and_reasons_say_why():
    res = grid(model, "ttft_p99=10s", [10, 60])
    assert [p.ok for p in res.points] == [True, False]
    assert res.points[1].reasons == ("ttft_p99=10s missed (1,000,000 ms)", "error rate 50.00% over 1.00%")


def test_grid_stops_at_the_first_failure():
    def bumpy(rate):
        return model(30.0 if rate == 45 else rate)

    res = grid(bumpy, SLOS, [10, 42, 45])
    assert res.max_rate_per_s == 10 and "45/s held again after 42/s failed" in res.notes[0]


def test_bad_arguments():
    with pytest.raises(ValueError, match="at least one percentile SLO"):
        find_max_rate(model, "ttft=1s", 1, 2)
    with pytest.raises(ValueError, match="0 < lo < hi"):
        find_max_rate(model, SLOS, 5, 5)
    with pytest.raises(ValueError, match="not both"):
        find_max_rate(model, SLOS, 1, 5, steps=2, tolerance=1)


def test_format_and_dict():
    res = find_max_rate(model, SLOS, 1.0, 100.0, steps=3)
    text = format_sweep(res)
    assert "max rate holding the SLOs:" in text and "ttft_p99=450ms missed" in text
    d = res.to_dict()
    assert d["max_rate_per_s"] == res.max_rate_per_s and d["points"][0]["latency_ms"]["ttft"]["p99"] > 0


def test_a_saturated_generator_does_not_hold_a_rate():
    def saturating(rate):
        s = model(rate)
        s["generator_saturated"] = rate > 20
        s["generator"] = {"schedule_lag_p99_ms": 35.0 if rate > 20 else 1.0}
        return s

    res = grid(saturating, SLOS, [10, 20, 30])
    assert res.max_rate_per_s == 20
    assert res.points[-1].reasons == ("generator saturated (schedule lag p99 35.0 ms): add workers",)
