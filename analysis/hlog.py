"""``metrics.hlog``: the one writer and reader of loadgen's interval histogram log.

The file is the standard HdrHistogram interval log (the format of the Java ``HistogramLogWriter``,
version 1.3 with tags), so hdrh's own ``HistogramLogReader`` and HdrHistogram's tools open it::

    #[Histogram log format version 1.3]
    #[StartTime: 1700000000.000 (seconds since epoch), 2023-11-14T22:13:20.000+00:00]
    #[BaseTime: 1700000000.000 (seconds since epoch)]
    "StartTimestamp","Interval_Length","Interval_Max","Interval_Compressed_Histogram"
    Tag=ttft:first:default:sim,0.000,1.000,812.031,HISTFAAAA...

One line per (tag, interval): ``Tag=<metric:turn_class:tenant:target>`` (``records.histogram_tag``),
the interval's start in seconds since the run's start (``run.json: t0_unix_s``, written as both
StartTime and BaseTime so readers need no guessing), its length in seconds, the largest value in
milliseconds (values are µs, so max/1000), and ``HdrHistogram.encode()`` of the interval's
histogram. A line is written with one ``write`` call, so a killed writer leaves at most a truncated
last line, which the reader drops with a note.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

import numpy as np
from hdrh.histogram import HdrHistogram

from analysis.errors import ResultsError
from analysis.hdr import record_many, record_many_each
from analysis.records import HIST_HIGHEST_US, HIST_LOWEST_US, HIST_SIGNIFICANT_DIGITS, METRICS_FILE

FORMAT_VERSION = "1.3"
LEGEND = '"StartTimestamp","Interval_Length","Interval_Max","Interval_Compressed_Histogram"'

_START_RE = re.compile(r"#\[StartTime: *([0-9.]+)")
_BASE_RE = re.compile(r"#\[BaseTime: *([0-9.]+)")
_BAD_TAG_CHARS = re.compile(r"[,\s]")


def new_histogram() -> HdrHistogram:
    """An empty histogram with loadgen's range: 1 µs .. 1 h at 3 significant digits."""
    return HdrHistogram(HIST_LOWEST_US, HIST_HIGHEST_US, HIST_SIGNIFICANT_DIGITS)


def clamp_us(value_us: float) -> int:
    """``value_us`` rounded and clamped into the histogram range (hdrh silently drops values outside)."""
    v = round(value_us)
    return HIST_LOWEST_US if v < HIST_LOWEST_US else HIST_HIGHEST_US if v > HIST_HIGHEST_US else v


def clamped_values(values: Sequence[float] | np.ndarray) -> np.ndarray:
    """``values`` as int64, each as ``clamp_us`` makes it (floats round half to even)."""
    arr = np.asarray(values)
    if arr.dtype.kind == "f":
        arr = np.rint(arr)
    return np.clip(arr.astype(np.int64), HIST_LOWEST_US, HIST_HIGHEST_US)


def record_clamped(h: HdrHistogram, values: Sequence[float] | np.ndarray) -> HdrHistogram:
    """Record every value into ``h`` as ``h.record_value(clamp_us(v))`` would, at numpy speed
    (counts, total, min and max alike; floats round half to even, as ``round``). Returns ``h``."""
    if not len(values):
        return h
    record_many(h, clamped_values(values))
    return h


def record_clamped_each(hs: Sequence[HdrHistogram], values: Sequence[float] | np.ndarray) -> None:
    """``record_clamped(h, values)`` for every ``h`` of ``hs``, the values clamped and bucketed once."""
    if len(values):
        record_many_each(hs, clamped_values(values))


def merge(histograms: Iterable[HdrHistogram]) -> HdrHistogram:
    """One new histogram holding every count of ``histograms`` (exact: counts add)."""
    out = new_histogram()
    for h in histograms:
        out.add(h)
    return out


# ---------------------------------------------------------------------------------------------- writing


def write_header(fp: IO[str], start_time_unix_s: float) -> None:
    """The format-version, StartTime and BaseTime comments and the legend line."""
    iso = datetime.fromtimestamp(start_time_unix_s, UTC).isoformat(timespec="milliseconds")
    fp.write(
        f"#[Histogram log format version {FORMAT_VERSION}]\n"
        f"#[StartTime: {start_time_unix_s:.3f} (seconds since epoch), {iso}]\n"
        f"#[BaseTime: {start_time_unix_s:.3f} (seconds since epoch)]\n"
        f"{LEGEND}\n"
    )


def write_interval(
    fp: IO[str], histogram: HdrHistogram, *, tag: str, start_s: float, length_s: float
) -> bool:
    """Append one interval line; returns False (and writes nothing) for an empty histogram.

    ``start_s`` is seconds since the run's start (>= 0), ``length_s`` the interval's length. Tags
    may not contain commas or whitespace (``records.histogram_tag`` makes valid ones).
    """
    if histogram.get_total_count() == 0:
        return False
    if not tag or _BAD_TAG_CHARS.search(tag):
        raise ValueError(f"histogram tag {tag!r} may not be empty or contain commas or whitespace")
    if not (math.isfinite(start_s) and math.isfinite(length_s)) or start_s < 0 or length_s < 0:
        raise ValueError(f"interval start {start_s!r} and length {length_s!r} must be finite and >= 0")
    payload = histogram.encode().decode("ascii")
    max_ms = histogram.get_max_value() / 1000.0
    fp.write(f"Tag={tag},{start_s:.3f},{length_s:.3f},{max_ms:.3f},{payload}\n")
    return True


class HlogWriter:
    """Writes ``metrics.hlog`` for one run: the header once, then interval lines as they come.

    Opens in append mode and writes the header only into an empty file, so reopening a file never
    duplicates it. ``flush()`` hands the bytes to the kernel (they survive the process being killed).
    """

    def __init__(self, path: str | Path, *, start_time_unix_s: float) -> None:
        self.path = Path(path)
        self._fp = open(self.path, "a", encoding="ascii")  # noqa: SIM115 (held open for the run)
        if self._fp.tell() == 0:
            write_header(self._fp, start_time_unix_s)

    def write_interval(self, histogram: HdrHistogram, *, tag: str, start_s: float, length_s: float) -> bool:
        return write_interval(self._fp, histogram, tag=tag, start_s=start_s, length_s=length_s)

    def flush(self) -> None:
        self._fp.flush()

    def close(self) -> None:
        self._fp.close()

    def __enter__(self) -> HlogWriter:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------- reading


@dataclass(frozen=True, slots=True)
class Interval:
    """One interval line. ``payload`` stays encoded until ``histogram()`` is asked for (memory)."""

    tag: str
    start_s: float  # since the run's start
    length_s: float
    max_ms: float
    payload: str
    line: int  # 1-based line number in the file, for error messages

    @property
    def end_s(self) -> float:
        return self.start_s + self.length_s

    def histogram(self) -> HdrHistogram:
        return HdrHistogram.decode(self.payload)


@dataclass
class Hlog:
    """A parsed ``metrics.hlog``: the start time, the interval lines, and notes for the reader."""

    path: Path
    start_time_unix_s: float | None
    intervals: list[Interval]
    notes: list[str] = field(default_factory=list)

    @property
    def tags(self) -> list[str]:
        return sorted({iv.tag for iv in self.intervals})

    def histograms(
        self, *, start_s: float | None = None, end_s: float | None = None, tags: Iterable[str] | None = None
    ) -> dict[str, HdrHistogram]:
        """``{tag: histogram}`` merged over the intervals that start in [start_s, end_s)."""
        wanted = None if tags is None else set(tags)
        out: dict[str, HdrHistogram] = {}
        for iv in self.intervals:
            if wanted is not None and iv.tag not in wanted:
                continue
            if (start_s is not None and iv.start_s < start_s) or (end_s is not None and iv.start_s >= end_s):
                continue
            h = out.get(iv.tag)
            if h is None:
                h = out[iv.tag] = new_histogram()
            try:
                h.decode_and_add(iv.payload)
            except Exception as e:  # base64, zlib and hdrh's own cookie errors
                raise ResultsError(
                    f"{self.path} line {iv.line}: histogram payload does not decode ({type(e).__name__}); "
                    "the file is corrupt"
                ) from None
        return out


def read_hlog(path: str | Path) -> Hlog:
    """Parse ``metrics.hlog`` (or any tagged HdrHistogram interval log).

    A last line that does not parse or decode (a writer killed mid-line) is dropped with a note; a
    bad line anywhere else raises ``ResultsError``. Timestamps are relative to StartTime (BaseTime
    when given, as loadgen writes; otherwise absolute timestamps are made relative to StartTime).
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="ascii", errors="replace")
    except FileNotFoundError:
        raise ResultsError(f"{p}: no such file; the run wrote no histograms (was it started?)") from None
    except OSError as e:
        raise ResultsError(f"{p}: cannot read ({e.strerror})") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    start = base = None
    intervals: list[Interval] = []
    notes: list[str] = []
    for i, line in enumerate(lines, start=1):
        if line.startswith("#"):
            m = _START_RE.match(line)
            if m:
                start = float(m.group(1))
            m = _BASE_RE.match(line)
            if m:
                base = float(m.group(1))
            continue
        if not line.strip() or line.startswith('"StartTimestamp"'):
            continue
        iv = _parse_interval(line, i)
        if iv is None or (i == len(lines) and not _decodes(iv.payload)):
            if i == len(lines):
                notes.append(f"{p.name}: last line is truncated and was ignored; the run was cut short")
                break
            raise ResultsError(f"{p} line {i}: not an interval histogram line; the file is corrupt")
        intervals.append(iv)
    _make_relative(intervals, start, base)
    return Hlog(p, start, intervals, notes)


def read_intervals(path: str | Path) -> list[Interval]:
    """The interval lines of ``path`` in file order (see ``read_hlog``)."""
    return read_hlog(path).intervals


def read_histograms(
    path: str | Path, *, start_s: float | None = None, end_s: float | None = None
) -> dict[str, HdrHistogram]:
    """``{tag: merged histogram}`` over the intervals of ``path`` starting in [start_s, end_s)."""
    return read_hlog(path).histograms(start_s=start_s, end_s=end_s)


def _parse_interval(line: str, lineno: int) -> Interval | None:
    tag = ""
    if line.startswith("Tag="):
        comma = line.find(",")
        if comma < 0:
            return None
        tag, line = line[4:comma], line[comma + 1 :]
    parts = line.split(",")
    if len(parts) != 4:
        return None
    try:
        start_s, length_s, max_ms = float(parts[0]), float(parts[1]), float(parts[2])
    except ValueError:
        return None
    payload = parts[3].strip()
    if not payload:
        return None
    return Interval(tag, start_s, length_s, max_ms, payload, lineno)


def _decodes(payload: str) -> bool:
    try:
        HdrHistogram.decode(payload)
    except Exception:
        return False
    return True


def _make_relative(intervals: list[Interval], start: float | None, base: float | None) -> None:
    """Rewrite absolute timestamps as seconds since StartTime (the Java reader's rule)."""
    if not intervals or start is None:
        return
    if base is None:
        # Same heuristic as the Java and Python readers: more than a year before StartTime means
        # the timestamps are already relative.
        base = start if intervals[0].start_s < start - 365 * 24 * 3600.0 else 0.0
    shift = base - start
    if shift:
        for k, iv in enumerate(intervals):
            intervals[k] = Interval(iv.tag, iv.start_s + shift, iv.length_s, iv.max_ms, iv.payload, iv.line)


__all__ = [
    "FORMAT_VERSION",
    "METRICS_FILE",
    "Hlog",
    "HlogWriter",
    "Interval",
    "clamp_us",
    "merge",
    "new_histogram",
    "read_histograms",
    "read_hlog",
    "read_intervals",
    "write_header",
    "write_interval",
]
