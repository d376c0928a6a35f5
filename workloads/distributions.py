"""Knob distributions: every workload knob is either a bare number or a seeded distribution.

Forms a spec may use (``where`` below is the spec file and key, used in error messages)::

    output_tokens: 64                                   # fixed
    think_time: 2s                                      # fixed; time knobs take durations
    turns: {dist: uniform, low: 4, high: 8}             # uniform on [low, high]
    user_tokens: {dist: normal, mean: 300, std: 80, min: 20}
    tool_output_tokens: {dist: lognormal, median: 1500, sigma: 0.8, max: 8000}
    tool_output_tokens: {dist: lognormal, mean: 2000, sigma: 0.8}
    think_time: {dist: exponential, mean: 1.5s, max: 10s}
    output_tokens: {dist: fixed, value: 64}

``lognormal`` takes ``sigma`` (the standard deviation of the log, dimensionless) and exactly one of
``median`` (= e^mu) or ``mean`` (the mean of the distribution itself, = e^(mu + sigma^2/2)); both are
in the knob's unit. ``exponential`` takes its ``mean``. Every sample is clamped to
``[min, max]`` (both optional) and to at least 0; integer knobs (token counts, turns) round to the
nearest integer after clamping. The mean a spec states is that of the unclamped distribution.

Sampling takes the caller's ``random.Random`` or ``numpy.random.Generator``, never a global one, so a
workload is a pure function of its seed.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.random

from analysis.units import DURATION_FORM, parse_duration_s
from workloads.errors import WorkloadError

KINDS: tuple[str, ...] = ("fixed", "uniform", "normal", "lognormal", "exponential")

# Parameters each kind requires; lognormal is special-cased (sigma plus mean or median).
_PARAMS: dict[str, tuple[str, ...]] = {
    "fixed": ("value",),
    "uniform": ("low", "high"),
    "normal": ("mean", "std"),
    "lognormal": ("sigma",),
    "exponential": ("mean",),
}
_OPTIONAL: dict[str, tuple[str, ...]] = {"lognormal": ("mean", "median")}
_BOUNDS = ("min", "max")
# Parameters in the knob's own unit (so a duration on a time knob); sigma is dimensionless.
_DIMENSIONLESS = frozenset({"sigma"})


@dataclass(frozen=True, slots=True)
class Distribution:
    """A parsed knob: ``kind`` (one of :data:`KINDS`), its parameters, optional bounds.

    Parameters and bounds are plain floats in the knob's unit (seconds for time knobs). ``integer``
    knobs round their samples. Build one with :func:`parse_distribution` or :func:`fixed`.
    """

    kind: str
    params: tuple[tuple[str, float], ...]
    min: float | None = None
    max: float | None = None
    integer: bool = False

    def param(self, name: str) -> float | None:
        for key, value in self.params:
            if key == name:
                return value
        return None

    @property
    def mean(self) -> float:
        """Mean of the unclamped distribution, in the knob's unit."""
        p = dict(self.params)
        if self.kind == "fixed":
            return p["value"]
        if self.kind == "uniform":
            return (p["low"] + p["high"]) / 2
        if self.kind in ("normal", "exponential"):
            return p["mean"]
        return math.exp(self._lognormal_mu() + p["sigma"] ** 2 / 2)

    def _lognormal_mu(self) -> float:
        p = dict(self.params)
        if "median" in p:
            return math.log(p["median"])
        return math.log(p["mean"]) - p["sigma"] ** 2 / 2

    def sample(self, rng: random.Random | np.random.Generator) -> float | int:
        """One draw, clamped to ``[min, max]`` and to at least 0; rounded for integer knobs."""
        x = self._draw(rng)
        if self.min is not None:
            x = max(x, self.min)
        if self.max is not None:
            x = min(x, self.max)
        x = max(x, 0.0)
        if not self.integer:
            return x
        n = round(x)
        # Rounding must not step outside fractional bounds (min: 2.5 means at least 3).
        if self.min is not None and n < self.min:
            n = math.ceil(self.min)
        if self.max is not None and n > self.max:
            n = math.floor(self.max)
        return max(int(n), 0)

    def _draw(self, rng: random.Random | np.random.Generator) -> float:
        p = dict(self.params)
        if self.kind == "fixed":
            return p["value"]
        is_np = isinstance(rng, np.random.Generator)
        if self.kind == "uniform":
            return float(rng.uniform(p["low"], p["high"]))
        if self.kind == "normal":
            return float(rng.normal(p["mean"], p["std"])) if is_np else rng.normalvariate(p["mean"], p["std"])
        if self.kind == "lognormal":
            mu, sigma = self._lognormal_mu(), p["sigma"]
            return float(rng.lognormal(mu, sigma)) if is_np else rng.lognormvariate(mu, sigma)
        # exponential
        if p["mean"] == 0:
            return 0.0
        return float(rng.exponential(p["mean"])) if is_np else rng.expovariate(1.0 / p["mean"])

    def to_dict(self) -> float | int | dict[str, Any]:
        """The canonical spec form: a bare number when fixed without bounds, else a mapping."""
        if self.kind == "fixed" and self.min is None and self.max is None:
            return _plain(self.params[0][1])
        out: dict[str, Any] = {"dist": self.kind}
        out.update((k, _plain(v)) for k, v in self.params)
        if self.min is not None:
            out["min"] = _plain(self.min)
        if self.max is not None:
            out["max"] = _plain(self.max)
        return out


def _plain(x: float) -> float | int:
    """Whole floats as ints, so canonical JSON does not depend on how the user wrote 3 vs 3.0."""
    return int(x) if float(x).is_integer() and abs(x) < 2**53 else float(x)


def fixed(value: float, *, integer: bool = False) -> Distribution:
    """A distribution that always gives ``value``."""
    return Distribution("fixed", (("value", float(value)),), integer=integer)


def parse_distribution(
    value: Any, *, where: str, integer: bool = False, duration: bool = False, at_least: float = 0
) -> Distribution:
    """Parse a knob from a spec: a bare number (or duration string on a ``duration`` knob) or a mapping.

    ``where`` prefixes every error (``"my.yaml: think_time"``). ``integer`` knobs require whole fixed
    values and round samples. ``at_least`` is the smallest value the knob accepts (e.g. 1 for turns);
    a fixed value below it is an error, and the caller clamps samples to it.
    Raises :class:`WorkloadError` with a one-line message.
    """
    if isinstance(value, Mapping):
        return _parse_mapping(value, where=where, integer=integer, duration=duration, at_least=at_least)
    x = _number(value, where=where, duration=duration, integer=integer)
    if x < at_least:
        raise WorkloadError(
            f"{where}: {value!r} is below {_plain(at_least)}; use a value >= {_plain(at_least)}"
        )
    if integer and not x.is_integer():
        raise WorkloadError(f"{where}: {value!r} is not a whole number; use an integer")
    return fixed(x, integer=integer)


def _parse_mapping(
    spec: Mapping, *, where: str, integer: bool, duration: bool, at_least: float
) -> Distribution:
    if "dist" not in spec:
        raise WorkloadError(f"{where}: missing key 'dist'; use one of {', '.join(KINDS)}")
    kind = spec["dist"]
    if kind not in KINDS:
        raise WorkloadError(f"{where}: unknown distribution {kind!r}; use one of {', '.join(KINDS)}")
    required, optional = _PARAMS[kind], _OPTIONAL.get(kind, ())
    allowed = ("dist", *required, *optional, *_BOUNDS)
    for key in spec:
        if key not in allowed:
            raise WorkloadError(
                f"{where}: unknown key {key!r} for a {kind} distribution; use {', '.join(allowed[1:])}"
            )
    for key in required:
        if key not in spec:
            raise WorkloadError(f"{where}: missing key {key!r} for a {kind} distribution; give {_give(kind)}")
    if kind == "lognormal" and ("mean" in spec) == ("median" in spec):
        raise WorkloadError(
            f"{where}: a lognormal distribution takes exactly one of mean or median, with sigma"
        )

    def num(key: str) -> float:
        is_time = duration and key not in _DIMENSIONLESS
        return _number(spec[key], where=f"{where}.{key}", duration=is_time, integer=integer)

    params = tuple((k, num(k)) for k in (*required, *optional) if k in spec)
    lo = num("min") if "min" in spec else None
    hi = num("max") if "max" in spec else None
    p = dict(params)
    if lo is not None and hi is not None and lo > hi:
        raise WorkloadError(f"{where}: min {spec['min']!r} is above max {spec['max']!r}; use min <= max")
    if kind == "uniform" and p["low"] > p["high"]:
        raise WorkloadError(f"{where}: low {spec['low']!r} is above high {spec['high']!r}; use low <= high")
    if kind == "lognormal":
        center = "median" if "median" in p else "mean"
        if p[center] <= 0:
            raise WorkloadError(
                f"{where}.{center}: {spec[center]!r} must be > 0 for a lognormal distribution"
            )
    if kind == "fixed":
        x = p["value"]
        if x < at_least:
            raise WorkloadError(
                f"{where}.value: {spec['value']!r} is below {_plain(at_least)}; use a value >= {_plain(at_least)}"
            )
        if integer and not x.is_integer():
            raise WorkloadError(f"{where}.value: {spec['value']!r} is not a whole number; use an integer")
    return Distribution(kind, params, lo, hi, integer)


def _give(kind: str) -> str:
    if kind == "lognormal":
        return "sigma and one of mean or median"
    return " and ".join(_PARAMS[kind])


def _number(value: Any, *, where: str, duration: bool, integer: bool) -> float:
    """A non-negative finite float from a YAML scalar; durations accepted where the knob is a time."""
    if duration:
        try:
            x = parse_duration_s(value)
        except ValueError:
            if isinstance(value, int | float) and not isinstance(value, bool) and value < 0:
                raise WorkloadError(
                    f"{where}: {value!r} is negative; use a duration >= 0 (e.g. 2s)"
                ) from None
            raise WorkloadError(
                f"{where}: {value!r} is not a duration; use {DURATION_FORM}, or a mapping with dist: one of "
                f"{', '.join(KINDS)}"
            ) from None
        return x
    if isinstance(value, bool) or not isinstance(value, int | float):
        what = "an integer" if integer else "a number"
        raise WorkloadError(
            f"{where}: {value!r} is not a number; use {what} or a mapping with dist: one of {', '.join(KINDS)}"
        )
    x = float(value)
    if not math.isfinite(x):
        raise WorkloadError(f"{where}: {value!r} is not finite; use a number >= 0")
    if x < 0:
        raise WorkloadError(f"{where}: {value!r} is negative; use a number >= 0")
    return x
