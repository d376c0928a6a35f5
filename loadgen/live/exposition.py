"""The Prometheus text exposition format (version 0.0.4), and exact histogram buckets from HDR data.

Pure functions, no server and no runtime state: ``render`` writes metric families as text, and
``hdr_buckets`` turns one HDR histogram (values in µs) into Prometheus' cumulative buckets.

Why bucket bounds are HDR bucket edges: an HDR histogram keeps a count per *range* of equivalent
values (1 µs wide below 2,048 µs, then 2, 4, 8, ... µs: 3 significant digits). A nominal bound such
as 500 ms falls inside the range 499,968..500,223 µs, so "values <= 500 ms" cannot be counted
exactly; "values <= 500.223 ms" can. Each bound is therefore raised to the top of the HDR range
that holds it (below 2.048 ms the nominal bound itself, above it at most 0.1% more), and every
bucket count is exact: the number of recorded values <= ``le``, which a rebuild from the raw
values in ``requests.jsonl`` reproduces to the request.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
from hdrh.histogram import HdrHistogram

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Nominal bucket bounds in µs, shared by every latency histogram: 100 µs .. 10 min, dense where
# token gaps and first-token times of real engines fall (5 .. 500 ms).
NOMINAL_BOUNDS_US: tuple[int, ...] = (
    100, 250, 500,
    1_000, 2_500, 5_000, 7_500,
    10_000, 15_000, 20_000, 25_000, 30_000, 40_000, 50_000, 75_000,
    100_000, 150_000, 200_000, 300_000, 400_000, 500_000, 750_000,
    1_000_000, 1_500_000, 2_000_000, 3_000_000, 5_000_000, 7_500_000,
    10_000_000, 15_000_000, 20_000_000, 30_000_000, 60_000_000, 120_000_000, 300_000_000, 600_000_000,
)  # fmt: skip

COUNTER = "counter"
GAUGE = "gauge"
HISTOGRAM = "histogram"

Labels = dict[str, str]


@dataclass
class Family:
    """One metric family: ``samples`` are (name suffix, rendered labels, value), e.g.
    ("_bucket", '{le="0.001"}', 3). Labels are rendered when added: a histogram's buckets share
    one escaped label text, which keeps a scrape of thousands of lines to a few milliseconds."""

    name: str
    kind: str
    help: str
    samples: list[tuple[str, str, float]] = field(default_factory=list)

    def add(self, value: float, labels: Labels | None = None, suffix: str = "") -> None:
        self.samples.append((suffix, "{" + _labels_inner(labels) + "}" if labels else "", value))


@dataclass(frozen=True)
class BucketLayout:
    """The ``le`` bounds (µs, each the top of an HDR range) and where they split a counts array."""

    le_us: tuple[int, ...]
    indexes: tuple[int, ...]  # counts-array index of each bound
    le_seconds: tuple[str, ...]
    segment_starts: tuple[int, ...]  # 0, then just past each bound: reduceat's segments

    @classmethod
    def for_histogram(cls, h: HdrHistogram, nominal_us: Sequence[int] = NOMINAL_BOUNDS_US) -> BucketLayout:
        # Every histogram of one configuration (range, significant digits) shares this layout.
        last = h.counts_len - 2  # each bound ends a segment; the last segment runs to the end
        le = sorted({h.get_highest_equivalent_value(b) for b in nominal_us})
        le = [v for v in le if h.get_counts_array_index(v) <= last]
        indexes = tuple(h.get_counts_array_index(v) for v in le)
        return cls(tuple(le), indexes, tuple(format_seconds(v) for v in le), (0, *(i + 1 for i in indexes)))


def hdr_buckets(h: HdrHistogram, layout: BucketLayout) -> tuple[list[int], int]:
    """(cumulative count at each ``le`` of ``layout``, total count): exact, from the counts array.

    One pass summing the counts between bounds (``reduceat``), ~10x faster than a full cumsum.
    """
    segments = np.add.reduceat(np.ctypeslib.as_array(h.counts), layout.segment_starts)
    cumulative = np.cumsum(segments).tolist()
    return cumulative[:-1], cumulative[-1]


def add_histogram(
    family: Family, h: HdrHistogram, layout: BucketLayout, labels: Labels, sum_seconds: float
) -> None:
    """``h``'s buckets, ``+Inf``, ``_sum`` and ``_count`` as samples of ``family``."""
    counts, total = hdr_buckets(h, layout)
    inner = _labels_inner(labels)
    head = "{" + inner + ',le="' if inner else '{le="'
    samples = family.samples
    for le, count in zip(layout.le_seconds, counts, strict=True):
        samples.append(("_bucket", head + le + '"}', count))
    samples.append(("_bucket", head + '+Inf"}', total))
    plain = "{" + inner + "}" if inner else ""
    samples.append(("_sum", plain, sum_seconds))
    samples.append(("_count", plain, total))


def format_seconds(value_us: int) -> str:
    """Integer µs as an exact decimal number of seconds: 1000 -> ``0.001``, 500223 -> ``0.500223``."""
    whole, frac = divmod(int(value_us), 1_000_000)
    return f"{whole}.{frac:06d}".rstrip("0").rstrip(".") if frac else str(whole)


def format_value(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def escape_label_value(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _labels_inner(labels: Labels | None) -> str:
    if not labels:
        return ""
    return ",".join(f'{k}="{escape_label_value(v)}"' for k, v in labels.items())


def render(families: Iterable[Family]) -> str:
    """The families as one exposition text (a family without samples is left out)."""
    lines: list[str] = []
    for fam in families:
        if not fam.samples:
            continue
        lines.append(f"# HELP {fam.name} {_escape_help(fam.help)}")
        lines.append(f"# TYPE {fam.name} {fam.kind}")
        name = fam.name
        for suffix, labels, value in fam.samples:
            lines.append(f"{name}{suffix}{labels} {format_value(value)}")
    return "\n".join(lines) + "\n" if lines else ""


__all__ = [
    "CONTENT_TYPE",
    "COUNTER",
    "GAUGE",
    "HISTOGRAM",
    "NOMINAL_BOUNDS_US",
    "BucketLayout",
    "Family",
    "add_histogram",
    "escape_label_value",
    "format_seconds",
    "format_value",
    "hdr_buckets",
    "render",
]
