"""Fast read-only queries on hdrh histograms, with numpy over the counts array.

hdrh's own ``get_mean_value`` and iterators walk every bucket in Python (~150 ms per histogram
at loadgen's 1 µs .. 1 h range); a summary asks for dozens. These functions read the counts once and
reproduce hdrh's definitions exactly (the tests check equality with hdrh's own answers).
``percentile_values`` is the one percentile every loadgen command prints:

* a percentile is the *highest equivalent value* of the first bucket whose cumulative count reaches
  ``max(1, int(p/100 * total + 0.5))`` (the *lowest* for p = 0), as ``get_value_at_percentile``;
* the mean weights each bucket's median equivalent value, as ``get_mean_value``;
* min and max are the lowest and highest equivalent values of the first and last non-empty buckets.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from hdrh.histogram import HdrHistogram


@dataclass(frozen=True, slots=True)
class Bins:
    """The non-empty buckets of a histogram, in value order."""

    lowest: np.ndarray  # lowest equivalent value of each bucket
    highest: np.ndarray  # highest equivalent value
    counts: np.ndarray

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    @property
    def median(self) -> np.ndarray:
        return self.lowest + (self.highest - self.lowest + 1) // 2


def bins(h: HdrHistogram) -> Bins:
    """The non-empty buckets of ``h``."""
    n = min(h.counts_len, h.encoder.payload.counts_len)  # decoded histograms may be shorter
    counts = np.ctypeslib.as_array(h.counts)[:n]
    idx = np.flatnonzero(counts)
    half_mag = h.sub_bucket_half_count_magnitude
    half = h.sub_bucket_half_count
    bucket = (idx >> half_mag) - 1
    sub = (idx & (half - 1)) + half
    low_bucket = bucket < 0
    sub = np.where(low_bucket, sub - half, sub)
    bucket = np.where(low_bucket, 0, bucket)
    shift = bucket + h.unit_magnitude
    lowest = sub.astype(np.int64) << shift
    size = np.int64(1) << shift
    return Bins(lowest, lowest + size - 1, counts[idx].astype(np.int64))


# Below this many values, record_many adds one count per value instead of a whole bincount of
# the 23,552 buckets (2-6 µs against 16-18 µs for up to 100 values; even at ~400).
SMALL_BATCH = 400


def record_many(h: HdrHistogram, values: np.ndarray) -> None:
    """Record every value of ``values`` (integers already in range) into ``h``: what a loop of
    ``h.record_value(v)`` does, with numpy (recording millions of ITL gaps one by one takes seconds)."""
    record_many_each((h,), values)


def _layout(h: HdrHistogram) -> tuple[int, int, int, int, int]:
    # len(h.counts), not counts_len: a decoded histogram's counts array may be shorter
    return (len(h.counts), h.sub_bucket_mask, h.unit_magnitude, h.sub_bucket_half_count_magnitude,
            h.sub_bucket_half_count)  # fmt: skip


def record_many_each(hs: Sequence[HdrHistogram], values: np.ndarray) -> None:
    """``record_many(h, values)`` for every ``h`` of ``hs``, each value's bucket found once for all
    the histograms of one layout (a master records each small delta into two: the cumulative
    histogram and the interval's)."""
    v = np.asarray(values, dtype=np.int64)
    v = v[v >= 0]
    if not len(v) or not hs:
        return
    first = hs[0]
    layout = _layout(first)
    same = []
    for h in hs:
        if _layout(h) == layout:
            same.append(h)
        else:  # another layout: its own buckets
            record_many_each((h,), v)
    # bit length of (v | sub_bucket_mask); exact through float64 for values below 2**53
    bits = np.frexp((v | first.sub_bucket_mask).astype(np.float64))[1].astype(np.int64)
    bucket = bits - first.unit_magnitude - (first.sub_bucket_half_count_magnitude + 1)
    sub = v >> (bucket + first.unit_magnitude)
    idx = ((bucket + 1) << first.sub_bucket_half_count_magnitude) + (sub - first.sub_bucket_half_count)
    n_counts = len(first.counts)
    keep = (idx >= 0) & (idx < n_counts)
    v, idx = v[keep], idx[keep]
    if not len(v):
        return
    # a few values: count them where they fall (bincount walks every bucket)
    added = None if len(idx) < SMALL_BATCH else np.bincount(idx, minlength=n_counts)
    low, high, n = int(v.min()), int(v.max()), len(v)
    for h in same:
        counts = np.ctypeslib.as_array(h.counts)
        if added is None:
            np.add.at(counts, idx, 1)
        else:
            counts += added.astype(counts.dtype)
        h.total_count += n
        h.min_value = min(h.min_value, low)
        h.max_value = max(h.max_value, high)


def value_at_percentiles(b: Bins, percentiles: list[float] | tuple[float, ...]) -> list[int]:
    """hdrh's ``get_value_at_percentile`` for each of ``percentiles`` (0 for an empty histogram)."""
    total = b.total
    if not total:
        return [0 for _ in percentiles]
    cum = np.cumsum(b.counts)
    out = []
    for p in percentiles:
        target = max(int(min(p, 100.0) * total / 100 + 0.5), 1)
        i = int(np.searchsorted(cum, target, side="left"))
        out.append(int(b.highest[i] if p else b.lowest[i]))
    return out


def percentile_values(h: HdrHistogram | None, percentiles: list[float] | tuple[float, ...]) -> list[int]:
    """loadgen's one percentile: the value at each of ``percentiles`` of the histogram ``h`` (0 for
    an empty one, or None). Every command that prints a percentile (summary.json and what reads
    it, compare, gate, sweep, the web UI, Prometheus) goes through here: a percentile is the
    *highest equivalent value* of the first bucket whose cumulative count reaches
    ``max(1, int(p/100 * total + 0.5))``, as hdrh's ``get_value_at_percentile`` (docs/metrics.md)."""
    if h is None:
        return [0 for _ in percentiles]
    return value_at_percentiles(bins(h), percentiles)


def value_at_percentile(h: HdrHistogram | None, percentile: float) -> int:
    """``percentile_values`` for one percentile."""
    return percentile_values(h, (percentile,))[0]


def mean(b: Bins) -> float:
    total = b.total
    return float((b.counts * b.median).sum() / total) if total else 0.0


def cdf(b: Bins, *, max_points: int = 400) -> tuple[np.ndarray, np.ndarray]:
    """(value, fraction of values <= value) at each bucket's highest value, thinned to ``max_points``
    by keeping the points nearest to evenly spaced fractions (the tail's last point always stays)."""
    total = b.total
    if not total:
        return np.zeros(0), np.zeros(0)
    frac = np.cumsum(b.counts) / total
    x = b.highest.astype(float)
    if len(x) > max_points:
        keep = np.unique(
            np.searchsorted(frac, np.linspace(0, 1, max_points), side="left").clip(0, len(x) - 1)
        )
        keep = np.unique(np.concatenate([keep, [0, len(x) - 1]]))
        x, frac = x[keep], frac[keep]
    return x, frac


__all__ = [
    "Bins",
    "bins",
    "cdf",
    "mean",
    "percentile_values",
    "record_many",
    "value_at_percentile",
    "value_at_percentiles",
]
