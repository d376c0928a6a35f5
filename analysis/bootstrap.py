"""Bootstrap confidence intervals for B - A and B / A of percentiles and means, vectorised with numpy.

Requests are the resampling unit. *Paired* (same sessions in both runs): resample the pairs, the
same index rows for A and B, so what both arms share (a long prompt, a slow session) cancels out.
*Unpaired*: resample each arm on its own. Intervals are percentile-bootstrap intervals.

Two kinds of sample:

* scalar, one value a request (TTFT, TPOT, E2E): a replicate is ``values[idx]`` for a
  ``(chunk, n)`` index matrix, and ``np.percentile(..., axis=1)`` gives every replicate at once;
  above ``EXACT_SCALAR_MAX`` requests, each row is counted into the bins described below instead
  (one ``bincount`` per chunk);
* pooled, a list of values a request (ITL gaps): the statistic is a percentile over all the gaps
  of the resampled requests (a cluster bootstrap: gaps within a request are not independent). Each
  request's gaps are counted into bins whose edges are quantiles of the pooled gaps, dense around
  each percentile asked for; a replicate's pooled histogram is ``weights @ counts`` (one matrix
  product per chunk) and its percentile is interpolated inside a bin about a quarter of a standard
  error wide.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

_CHUNK_ELEMENTS = 2_000_000  # elements per resampling chunk: bounds memory whatever n and n_boot
EXACT_SCALAR_MAX = 2000  # above this many requests, scalar percentiles use the binned estimator


@dataclass(frozen=True)
class Sample:
    """One arm's values for one metric: ``values`` (one a request) or ``groups`` (a list a request)."""

    values: np.ndarray | None = None
    groups: tuple[np.ndarray, ...] | None = None

    @classmethod
    def scalar(cls, values: Sequence[float] | np.ndarray) -> Sample:
        return cls(values=np.asarray(values, dtype=float))

    @classmethod
    def pooled(cls, groups: Sequence[Sequence[float]]) -> Sample:
        return cls(groups=tuple(np.asarray(g, dtype=float) for g in groups))

    def __len__(self) -> int:
        return len(self.values) if self.values is not None else len(self.groups or ())

    def pooled_values(self) -> np.ndarray:
        if self.values is not None:
            return self.values
        return np.concatenate(self.groups) if self.groups else np.zeros(0)

    def subset(self, index: np.ndarray) -> Sample:
        if self.values is not None:
            return Sample(values=self.values[index])
        assert self.groups is not None
        return Sample(groups=tuple(self.groups[i] for i in index))


@dataclass(frozen=True)
class Interval:
    """Point estimates and intervals for each statistic (``percentiles`` then the mean)."""

    stats: tuple[str, ...]
    a: np.ndarray
    b: np.ndarray
    delta_lo: np.ndarray
    delta_hi: np.ndarray
    ratio_lo: np.ndarray
    ratio_hi: np.ndarray

    @property
    def delta(self) -> np.ndarray:
        return self.b - self.a

    @property
    def ratio(self) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(self.a > 0, self.b / np.where(self.a > 0, self.a, 1), np.nan)


def point_estimates(sample: Sample, percentiles: Sequence[float]) -> np.ndarray:
    """The statistics of the sample itself: ``np.percentile`` (linear) of the values, then the mean."""
    v = sample.pooled_values()
    if not len(v):
        return np.full(len(percentiles) + 1, np.nan)
    return np.append(np.percentile(v, percentiles), v.mean())


def bootstrap(
    a: Sample,
    b: Sample,
    percentiles: Sequence[float] = (50, 90, 95, 99),
    *,
    paired: bool,
    n_boot: int = 2000,
    seed: int = 0,
    confidence: float = 0.95,
) -> Interval:
    """Intervals for B - A and B / A of each percentile and the mean.

    ``paired`` needs ``len(a) == len(b)`` with element i of both from the same request. Arms with
    fewer than two requests give NaN intervals.
    """
    stats = (*(f"p{p:g}" for p in percentiles), "mean")
    pa, pb = point_estimates(a, percentiles), point_estimates(b, percentiles)
    k = len(stats)
    nan = np.full(k, np.nan)
    if len(a) < 2 or len(b) < 2:
        return Interval(stats, pa, pb, nan, nan, nan, nan)
    if paired and len(a) != len(b):
        raise ValueError(f"a paired bootstrap needs arms of equal size (got {len(a)} and {len(b)})")
    rng = np.random.default_rng(seed)
    sa, sb = _Stat.of(a, percentiles), _Stat.of(b, percentiles)
    ra, rb = np.empty((n_boot, k)), np.empty((n_boot, k))
    width = max(len(a), len(b))
    chunk = max(1, min(n_boot, _CHUNK_ELEMENTS // width))
    for start in range(0, n_boot, chunk):
        m = min(chunk, n_boot - start)
        idx_a = rng.integers(0, len(a), size=(m, len(a)), dtype=np.int32)
        idx_b = idx_a if paired else rng.integers(0, len(b), size=(m, len(b)), dtype=np.int32)
        ra[start : start + m] = sa.replicates(idx_a)
        rb[start : start + m] = sb.replicates(idx_b)
    tail = 100 * (1 - confidence) / 2
    delta = rb - ra
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(ra > 0, rb / np.where(ra > 0, ra, 1), np.nan)
    dlo, dhi = np.percentile(delta, [tail, 100 - tail], axis=0)
    rlo, rhi = np.nanpercentile(ratio, [tail, 100 - tail], axis=0) if np.isfinite(ratio).any() else (nan, nan)
    return Interval(stats, pa, pb, dlo, dhi, rlo, rhi)


class _Stat:
    """Computes the statistics of many replicates from an index matrix."""

    @staticmethod
    def of(sample: Sample, percentiles: Sequence[float]) -> _Stat:
        if sample.values is None:
            return _PooledStat(sample.groups or (), percentiles)
        if len(sample.values) <= EXACT_SCALAR_MAX:
            return _ScalarStat(sample.values, percentiles)
        return _BinnedScalarStat(sample.values, percentiles)

    def replicates(self, idx: np.ndarray) -> np.ndarray:  # (m, n) -> (m, k)
        raise NotImplementedError


class _ScalarStat(_Stat):
    """Exact: ``np.percentile`` of every resampled row."""

    def __init__(self, values: np.ndarray, percentiles: Sequence[float]) -> None:
        self.values = values
        self.percentiles = list(percentiles)

    def replicates(self, idx: np.ndarray) -> np.ndarray:
        x = self.values[idx]
        out = np.empty((len(idx), len(self.percentiles) + 1))
        out[:, :-1] = np.percentile(x, self.percentiles, axis=1).T
        out[:, -1] = x.mean(axis=1)
        return out


class _Bins:
    """Bin edges at quantiles of the data: 32 equal-mass bins, plus 48 across +-8 standard errors
    (in probability) around each percentile asked for, where every replicate's answer falls."""

    _COARSE = 32
    _FINE = 48
    _HALF_WIDTH_SE = 8.0

    def __init__(self, values: np.ndarray, targets: np.ndarray, units: int) -> None:
        probs = [np.linspace(0, 1, self._COARSE + 1)]
        for p in targets:
            half = min(0.5, self._HALF_WIDTH_SE * np.sqrt(p * (1 - p) / max(units, 1)) + 1e-3)
            probs.append(np.linspace(max(0.0, p - half), min(1.0, p + half), self._FINE + 1))
        self.edges = (
            np.unique(np.quantile(values, np.unique(np.concatenate(probs)))) if len(values) else np.zeros(1)
        )
        self.count = max(len(self.edges) - 1, 1)
        self.targets = targets

    def of(self, values: np.ndarray) -> np.ndarray:
        return np.clip(np.searchsorted(self.edges, values, side="right") - 1, 0, self.count - 1)

    def quantiles(self, hist: np.ndarray) -> np.ndarray:
        """(m, len(targets)): each row's quantiles, interpolated linearly inside the bin."""
        m = len(hist)
        out = np.empty((m, len(self.targets)))
        if len(self.edges) < 2:  # every value is the same
            out[:] = self.edges[0]
            return out
        cum = np.cumsum(hist, axis=1, dtype=np.float64)
        rows = np.arange(m)
        for j, p in enumerate(self.targets):
            target = p * cum[:, -1]
            k = np.minimum((cum < target[:, None]).sum(axis=1), hist.shape[1] - 1)
            below = np.where(k > 0, cum[rows, k - 1], 0.0)
            inside = hist[rows, k]
            frac = np.clip(
                np.where(inside > 0, (target - below) / np.where(inside > 0, inside, 1), 0.0), 0, 1
            )
            out[:, j] = self.edges[k] + frac * (self.edges[k + 1] - self.edges[k])
        return out


class _BinnedScalarStat(_Stat):
    """Large samples: a replicate's histogram is one ``bincount`` of its rows' bins, O(n) per row,
    where sorting-based percentiles cost several passes (8 s of a 20,000-request compare)."""

    def __init__(self, values: np.ndarray, percentiles: Sequence[float]) -> None:
        self.values = values
        self.bins = _Bins(values, np.asarray(percentiles, dtype=float) / 100.0, len(values))
        self.bin_of = self.bins.of(values).astype(np.int32)

    def replicates(self, idx: np.ndarray) -> np.ndarray:
        m, k = len(idx), self.bins.count
        flat = (self.bin_of[idx] + (np.arange(m, dtype=np.int32) * k)[:, None]).ravel()
        hist = np.bincount(flat, minlength=m * k).reshape(m, k)
        out = np.empty((m, len(self.bins.targets) + 1))
        out[:, :-1] = self.bins.quantiles(hist)
        out[:, -1] = self.values[idx].mean(axis=1)
        return out


class _PooledStat(_Stat):
    """Lists of values per request: a replicate's pooled histogram is ``weights @ counts``."""

    def __init__(self, groups: tuple[np.ndarray, ...], percentiles: Sequence[float]) -> None:
        self.n = len(groups)
        sizes = np.array([len(g) for g in groups])
        values = np.concatenate(groups) if groups else np.zeros(0)
        owner = np.repeat(np.arange(self.n), sizes)
        self.sums = np.bincount(owner, weights=values, minlength=self.n).astype(np.float32)
        self.sizes = sizes.astype(np.float32)
        self.bins = _Bins(values, np.asarray(percentiles, dtype=float) / 100.0, self.n)
        k = self.bins.count
        flat = np.bincount(owner * k + self.bins.of(values), minlength=self.n * k)
        self.counts = flat.reshape(self.n, k).astype(np.float32)

    def replicates(self, idx: np.ndarray) -> np.ndarray:
        m = len(idx)
        rows = (idx + (np.arange(m) * self.n)[:, None]).ravel()
        w = np.bincount(rows, minlength=m * self.n).reshape(m, self.n).astype(np.float32)
        out = np.empty((m, len(self.bins.targets) + 1))
        out[:, :-1] = self.bins.quantiles(w @ self.counts)  # (m, bins): each replicate's pooled gaps
        with np.errstate(divide="ignore", invalid="ignore"):
            out[:, -1] = (w @ self.sums) / (w @ self.sizes)
        return out


__all__ = ["Interval", "Sample", "bootstrap", "point_estimates"]
