"""Knob distributions: parameters, clamping, rounding, determinism and one-line errors."""

from __future__ import annotations

import math
import random
import statistics

import numpy as np
import pytest

from workloads.distributions import parse_distribution
from workloads.errors import WorkloadError

N = 40_000


def _samples(spec, *, seed=1, integer=False, duration=False, numpy_rng=False):
    d = parse_distribution(spec, where="w.yaml: k", integer=integer, duration=duration)
    rng = np.random.default_rng(seed) if numpy_rng else random.Random(seed)
    return d, [d.sample(rng) for _ in range(N)]


@pytest.mark.parametrize("numpy_rng", [False, True])
@pytest.mark.parametrize(
    ("spec", "mean", "std"),
    [
        ({"dist": "uniform", "low": 10, "high": 30}, 20.0, 20 / math.sqrt(12)),
        ({"dist": "normal", "mean": 500, "std": 50}, 500.0, 50.0),
        ({"dist": "exponential", "mean": 3}, 3.0, 3.0),
        # lognormal by its mean: e^(mu + s^2/2) = 100
        ({"dist": "lognormal", "mean": 100, "sigma": 0.5}, 100.0, 100 * math.sqrt(math.exp(0.25) - 1)),
        # lognormal by its median: mean = 100 * e^(0.5^2/2)
        ({"dist": "lognormal", "median": 100, "sigma": 0.5}, 100 * math.exp(0.125), None),
    ],
)
def test_parameters_give_the_stated_mean(spec, mean, std, numpy_rng):
    d, xs = _samples(spec, numpy_rng=numpy_rng)
    assert d.mean == pytest.approx(mean, rel=1e-12)
    assert statistics.fmean(xs) == pytest.approx(mean, rel=0.02)
    if std is not None:
        assert statistics.pstdev(xs) == pytest.approx(std, rel=0.03)


def test_lognormal_median_is_the_median():
    _, xs = _samples({"dist": "lognormal", "median": 1200, "sigma": 0.9})
    assert statistics.median(xs) == pytest.approx(1200, rel=0.03)


def test_fixed_forms():
    for spec in (64, 64.0, {"dist": "fixed", "value": 64}):
        d, xs = _samples(spec, integer=True)
        assert set(xs) == {64}
        assert all(isinstance(x, int) for x in xs)
    d = parse_distribution("1500ms", where="w.yaml: think_time", duration=True)
    assert d.sample(random.Random(0)) == 1.5
    assert d.to_dict() == 1.5


def test_durations_in_time_knob_parameters():
    d, xs = _samples({"dist": "uniform", "low": "500ms", "high": "2s", "max": "1s"}, duration=True)
    assert d.to_dict() == {"dist": "uniform", "low": 0.5, "high": 2, "max": 1}
    assert min(xs) >= 0.5 and max(xs) == 1.0
    # sigma stays dimensionless on a time knob
    d = parse_distribution({"dist": "lognormal", "median": "1s", "sigma": 0.5}, where="w", duration=True)
    assert d.param("sigma") == 0.5 and d.param("median") == 1.0


def test_clamping_and_rounding():
    _, xs = _samples({"dist": "normal", "mean": 10, "std": 20, "min": 3, "max": 15}, integer=True)
    assert min(xs) == 3 and max(xs) == 15
    assert all(isinstance(x, int) for x in xs)
    # never negative even without min
    _, xs = _samples({"dist": "normal", "mean": 1, "std": 5})
    assert min(xs) == 0.0
    # rounding never leaves fractional bounds
    _, xs = _samples({"dist": "uniform", "low": 0, "high": 10, "min": 2.5, "max": 7.5}, integer=True)
    assert min(xs) == 3 and max(xs) == 7


def test_integer_rounding_is_to_nearest():
    _, xs = _samples({"dist": "uniform", "low": 1, "high": 2}, integer=True)
    share_two = xs.count(2) / len(xs)
    assert set(xs) == {1, 2}
    assert share_two == pytest.approx(0.5, abs=0.02)


def test_sampling_is_deterministic_per_rng_seed():
    spec = {"dist": "lognormal", "mean": 50, "sigma": 1.0}
    assert _samples(spec, seed=4)[1] == _samples(spec, seed=4)[1]
    assert _samples(spec, seed=4)[1] != _samples(spec, seed=5)[1]


@pytest.mark.parametrize(
    ("spec", "kwargs", "message"),
    [
        (
            {"dist": "weibull", "k": 1},
            {},
            "w.yaml: think_time: unknown distribution 'weibull'; use one of fixed, uniform, normal, lognormal, exponential",
        ),
        (
            {"low": 1, "high": 2},
            {},
            "w.yaml: think_time: missing key 'dist'; use one of fixed, uniform, normal, lognormal, exponential",
        ),
        (
            {"dist": "uniform", "low": 1},
            {},
            "w.yaml: think_time: missing key 'high' for a uniform distribution; give low and high",
        ),
        (
            {"dist": "uniform", "low": 1, "high": 2, "mean": 3},
            {},
            "w.yaml: think_time: unknown key 'mean' for a uniform distribution; use low, high, min, max",
        ),
        (
            {"dist": "uniform", "low": -1, "high": 2},
            {},
            "w.yaml: think_time.low: -1 is negative; use a number >= 0",
        ),
        (-3, {}, "w.yaml: think_time: -3 is negative; use a number >= 0"),
        (
            {"dist": "uniform", "low": 3, "high": 2},
            {},
            "w.yaml: think_time: low 3 is above high 2; use low <= high",
        ),
        (
            {"dist": "normal", "mean": 3, "std": 1, "min": 5, "max": 4},
            {},
            "w.yaml: think_time: min 5 is above max 4; use min <= max",
        ),
        (
            {"dist": "lognormal", "mean": 3, "median": 3, "sigma": 1},
            {},
            "w.yaml: think_time: a lognormal distribution takes exactly one of mean or median, with sigma",
        ),
        (
            {"dist": "lognormal", "median": 0, "sigma": 1},
            {},
            "w.yaml: think_time.median: 0 must be > 0 for a lognormal distribution",
        ),
        (
            "fast",
            {},
            "w.yaml: think_time: 'fast' is not a number; use a number or a mapping with dist: one of "
            "fixed, uniform, normal, lognormal, exponential",
        ),
        (
            "fast",
            {"duration": True},
            "w.yaml: think_time: 'fast' is not a duration; use a number with a unit: us, ms, s, m or h "
            "(e.g. 500ms, 90s, 2m); a bare number is seconds, or a mapping with dist: one of fixed, uniform, "
            "normal, lognormal, exponential",
        ),
        (-2, {"duration": True}, "w.yaml: think_time: -2 is negative; use a duration >= 0 (e.g. 2s)"),
        (
            True,
            {},
            "w.yaml: think_time: True is not a number; use a number or a mapping with dist: one of "
            "fixed, uniform, normal, lognormal, exponential",
        ),
        (2.5, {"integer": True}, "w.yaml: think_time: 2.5 is not a whole number; use an integer"),
        (0, {"at_least": 1}, "w.yaml: think_time: 0 is below 1; use a value >= 1"),
    ],
)
def test_errors_are_one_line_and_exact(spec, kwargs, message):
    with pytest.raises(WorkloadError) as err:
        parse_distribution(spec, where="w.yaml: think_time", **kwargs)
    assert str(err.value) == message
    assert "\n" not in str(err.value)
