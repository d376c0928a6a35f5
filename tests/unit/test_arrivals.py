"""Arrival schedules: statistics, exactness, trace forms, worker split, determinism, prefix property."""

from __future__ import annotations

import json

import numpy as np
import pytest

from workloads import arrivals
from workloads.arrivals import constant, gamma, poisson, schedule, trace, worker_share
from workloads.errors import WorkloadError


def _gaps(times: np.ndarray) -> np.ndarray:
    return np.diff(times)


# --- statistics -------------------------------------------------------------------------------------


def test_poisson_mean_and_cv_over_100k_draws():
    rate = 40.0
    t = poisson(rate, seed=7, n=100_001)
    g = _gaps(t)
    assert len(g) == 100_000
    assert g.mean() == pytest.approx(1 / rate, rel=0.02)
    assert g.std() / g.mean() == pytest.approx(1.0, rel=0.02)


@pytest.mark.parametrize("burstiness", [0.25, 0.5, 1.0, 2.0, 4.0])
def test_gamma_cv_is_one_over_sqrt_burstiness(burstiness):
    rate = 10.0
    g = _gaps(gamma(rate, burstiness, seed=11, n=200_001))
    assert g.mean() == pytest.approx(1 / rate, rel=0.03)
    assert g.std() / g.mean() == pytest.approx(1 / np.sqrt(burstiness), rel=0.03)


def test_constant_is_exact():
    t = constant(4, n=9)
    assert t.dtype == np.float64
    np.testing.assert_array_equal(t, np.arange(9) / 4.0)
    # duration bound: every k/rate strictly before the end
    np.testing.assert_array_equal(constant("2/s", duration_s="3s"), [0.0, 0.5, 1.0, 1.5, 2.0, 2.5])


def test_first_arrival_at_zero_and_sorted():
    for t in (poisson(5, seed=1, n=50), gamma(5, 0.3, seed=1, n=50), constant(5, n=50)):
        assert t[0] == 0.0
        assert np.all(np.diff(t) >= 0)


def test_rate_strings_parse():
    np.testing.assert_array_equal(constant("30/min", n=3), [0.0, 2.0, 4.0])


# --- determinism and prefix -------------------------------------------------------------------------


@pytest.mark.parametrize("fn", [lambda **kw: poisson(3.0, **kw), lambda **kw: gamma(3.0, 0.5, **kw)])
def test_same_seed_same_schedule_other_seed_differs(fn):
    a, b, c = fn(seed=5, n=1000), fn(seed=5, n=1000), fn(seed=6, n=1000)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


@pytest.mark.parametrize(
    "fn",
    [
        lambda **kw: poisson(50.0, **kw),
        lambda **kw: gamma(50.0, 0.25, **kw),
        lambda **kw: constant(50.0, **kw),
    ],
)
def test_n_and_duration_give_the_same_prefix(fn):
    # Long enough to span several internal chunks.
    long = fn(seed=3, duration_s=600)
    assert long[-1] < 600
    assert len(long) > 3 * arrivals._CHUNK
    for n in (1, 2, 17, arrivals._CHUNK, arrivals._CHUNK + 1, len(long)):
        np.testing.assert_array_equal(fn(seed=3, n=n), long[:n])
    short = fn(seed=3, duration_s=100)
    np.testing.assert_array_equal(short, long[: len(short)])
    # duration mode stops exactly at the first arrival at or beyond the bound
    assert fn(seed=3, n=len(long) + 1)[-1] >= 600


def test_duration_bound_count_matches_rate():
    t = poisson(100, seed=2, duration_s=300)
    assert len(t) == pytest.approx(30_000, rel=0.02)


# --- worker split ------------------------------------------------------------------------------------


@pytest.mark.parametrize("n_workers", [1, 2, 3, 4, 5])
def test_worker_shares_union_is_the_single_schedule(n_workers):
    single = poisson(20, seed=9, n=1003)
    shares = [worker_share(single, n_workers, slot) for slot in range(n_workers)]
    for slot, idx in enumerate(shares):
        assert np.all(idx % n_workers == slot)
        assert np.all(np.diff(idx) > 0)
    every = np.sort(np.concatenate(shares))
    np.testing.assert_array_equal(every, np.arange(len(single)))
    merged = np.sort(np.concatenate([single[idx] for idx in shares]))
    np.testing.assert_array_equal(merged, single)


def test_worker_share_takes_a_length_and_validates():
    np.testing.assert_array_equal(worker_share(10, 3, 1), [1, 4, 7])
    np.testing.assert_array_equal(worker_share(0, 2, 1), [])
    with pytest.raises(WorkloadError, match=r"^arrivals: slot 3 is not allowed; use an integer from 0 to 2$"):
        worker_share(10, 3, 3)
    with pytest.raises(WorkloadError, match=r"^arrivals: n_workers 0 is not allowed"):
        worker_share(10, 0, 0)


# --- traces ------------------------------------------------------------------------------------------


def test_trace_plain_numbers_rebased_sorted_scaled(tmp_path):
    p = tmp_path / "times.txt"
    p.write_text("# seconds\n100.5\n\n100.0\n102.0\n101.0\n")
    np.testing.assert_array_equal(trace(p), [0.0, 0.5, 1.0, 2.0])
    np.testing.assert_array_equal(trace(p, time_scale=0.5), [0.0, 0.25, 0.5, 1.0])
    np.testing.assert_array_equal(trace(p, n=2), [0.0, 0.5])
    np.testing.assert_array_equal(trace(p, duration_s=1.0), [0.0, 0.5])


def test_trace_azure_csv_with_iso_datetimes(tmp_path):
    p = tmp_path / "azure.csv"
    p.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:50.9951690,396,109\n"
        "2023-11-16 18:15:51.6805900,879,55\n"
    )
    t = trace(p, time_scale=2.0)
    np.testing.assert_allclose(t, [0.0, 2 * 4.314579, 10.0], atol=1e-6)


def test_trace_csv_with_numbers(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("id,timestamp\na,10\nb,12.5\nc,11\n")
    np.testing.assert_array_equal(trace(p), [0.0, 1.0, 2.5])


def test_trace_mooncake_jsonl_in_milliseconds(tmp_path):
    p = tmp_path / "mooncake.jsonl"
    rows = [{"timestamp": 1000, "input_length": 5}, {"timestamp": 1250}, {"timestamp": 4000}]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    np.testing.assert_array_equal(trace(p), [0.0, 0.25, 3.0])
    np.testing.assert_allclose(trace(p, time_scale=0.1), [0.0, 0.025, 0.3], rtol=1e-12)


def test_trace_errors(tmp_path):
    missing = tmp_path / "nope.txt"
    with pytest.raises(
        WorkloadError, match=r"^.*nope\.txt: cannot read the trace \(.*\); give a readable text file$"
    ):
        trace(missing)
    p = tmp_path / "t.txt"
    p.write_text("1\n2\nfast\n")
    with pytest.raises(
        WorkloadError, match=r"t\.txt line 3: 'fast' is not a number; give seconds, one per line$"
    ):
        trace(p)
    p.write_text("1\n2\n")
    with pytest.raises(WorkloadError, match=r"asked for 5 arrivals but the trace holds 2"):
        trace(p, n=5)
    with pytest.raises(WorkloadError, match=r"time_scale: 0 is not allowed; use a number > 0"):
        trace(p, time_scale=0)
    c = tmp_path / "c.csv"
    c.write_text("when,x\n1,2\n")
    with pytest.raises(WorkloadError, match=r"c\.csv line 1: no timestamp column"):
        trace(c)
    j = tmp_path / "j.jsonl"
    j.write_text('{"timestamp": 5}\n{"ts": 6}\n')
    with pytest.raises(
        WorkloadError,
        match=r"j\.jsonl line 2: timestamp: None is not allowed; give a number of milliseconds$",
    ):
        trace(j)


# --- validation and dispatch ----------------------------------------------------------------------------


def test_validation_messages():
    with pytest.raises(
        WorkloadError, match=r"^arrivals: rate_per_s: 0 is not allowed; use .* greater than 0$"
    ):
        poisson(0, seed=1, n=5)
    with pytest.raises(WorkloadError, match=r"^arrivals: rate_per_s: -2 is not allowed"):
        constant(-2, n=5)
    with pytest.raises(WorkloadError, match=r"^arrivals: burstiness: 0 is not allowed; use a number > 0"):
        gamma(1, 0, seed=1, n=5)
    with pytest.raises(WorkloadError, match=r"^arrivals: burstiness: -1 is not allowed"):
        gamma(1, -1, seed=1, n=5)
    with pytest.raises(WorkloadError, match=r"^arrivals: neither n nor duration_s given; give exactly one"):
        poisson(1, seed=1)
    with pytest.raises(WorkloadError, match=r"^arrivals: both n and duration_s given"):
        poisson(1, seed=1, n=3, duration_s=3)
    with pytest.raises(WorkloadError, match=r"^arrivals: n: 0 is not allowed; use an integer >= 1$"):
        poisson(1, seed=1, n=0)
    with pytest.raises(WorkloadError, match=r"^arrivals: seed -1 is not allowed"):
        poisson(1, seed=-1, n=3)


def test_schedule_dispatches(tmp_path):
    np.testing.assert_array_equal(schedule("poisson", rate_per_s=2, seed=4, n=10), poisson(2, seed=4, n=10))
    np.testing.assert_array_equal(
        schedule("gamma", rate_per_s=2, burstiness=0.5, seed=4, n=10), gamma(2, 0.5, seed=4, n=10)
    )
    np.testing.assert_array_equal(schedule("constant", rate_per_s=2, n=3), [0.0, 0.5, 1.0])
    p = tmp_path / "t.txt"
    p.write_text("5\n6\n")
    np.testing.assert_array_equal(schedule("trace", path=p, time_scale=3), [0.0, 3.0])
    with pytest.raises(
        WorkloadError, match=r"^arrivals: unknown kind 'weibull'; use one of poisson, gamma, constant, trace$"
    ):
        schedule("weibull", rate_per_s=1, n=1)
    with pytest.raises(WorkloadError, match=r"^arrivals: poisson: missing rate_per_s"):
        schedule("poisson", n=1)
