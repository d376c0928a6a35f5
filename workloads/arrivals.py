"""Open-loop arrival schedules: intended session start times, pure and seeded.

Every function returns a sorted ``numpy.float64`` array of offsets in seconds from the run start.
The first arrival is at 0 and each later one follows the previous by one inter-arrival gap. Exactly
one of ``n`` (that many arrivals) or ``duration_s`` (every arrival before that offset) bounds a
schedule; a trace may give neither and then is used whole.

For a given seed the schedule is one infinite sequence cut at ``n`` or ``duration_s``: the first k
arrivals are the same whichever bound was asked (gaps are drawn in fixed-size chunks from one
``numpy.random.Generator``, and the cumulative sum is sequential, so it is bit-identical).

Distributed runs (docs/distributed.md): every worker builds the same schedule from the seed and keeps
arrival k when ``k % n_workers == slot`` (:func:`worker_share`), so the union over workers is exactly
the single-process schedule and session k is the same session whatever the worker count.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path

import numpy as np

from analysis.units import DURATION_FORM, RATE_FORM, parse_duration_s, parse_rate_per_s
from workloads.compressed import data_suffix, read_bytes, universal_newlines
from workloads.errors import WorkloadError

ARRIVAL_KINDS: tuple[str, ...] = ("poisson", "gamma", "constant", "trace")

_CHUNK = 4096  # gaps drawn per call; fixed so that the n and duration_s paths draw the same stream
MAX_ARRIVALS = 50_000_000  # ~400 MB of float64: beyond this a schedule is surely a typo


def poisson(
    rate_per_s: float | str, *, seed: int, n: int | None = None, duration_s: float | str | None = None
) -> np.ndarray:
    """Poisson arrivals: exponential gaps with mean ``1/rate_per_s`` (CV 1)."""
    rate = _rate(rate_per_s)
    n, duration = _bounds(n, duration_s, rate)
    gen = _generator(seed)
    return _accumulate(lambda: gen.exponential(1.0 / rate, _CHUNK), n=n, duration_s=duration)


def gamma(
    rate_per_s: float | str,
    burstiness: float,
    *,
    seed: int,
    n: int | None = None,
    duration_s: float | str | None = None,
) -> np.ndarray:
    """Gamma-distributed gaps, with vLLM's ``--burstiness`` meaning.

    shape = ``burstiness``, scale = ``1/(rate_per_s * burstiness)``: the mean gap stays ``1/rate``
    and the coefficient of variation is ``1/sqrt(burstiness)``. 1 is Poisson; below 1 is burstier,
    above 1 smoother. Unlike vLLM's benchmark, gaps are not rescaled to hit the rate exactly over
    one run (that would make the first k arrivals depend on n); the realised rate drifts as a
    random sample does, by about ``CV/sqrt(n)``.
    """
    rate = _rate(rate_per_s)
    if (
        isinstance(burstiness, bool)
        or not isinstance(burstiness, int | float)
        or not (math.isfinite(burstiness) and burstiness > 0)
    ):
        raise WorkloadError(
            f"arrivals: burstiness: {burstiness!r} is not allowed; use a number > 0 "
            "(1 = Poisson, below 1 burstier, above 1 smoother)"
        )
    n, duration = _bounds(n, duration_s, rate)
    gen = _generator(seed)
    shape, scale = float(burstiness), 1.0 / (rate * burstiness)
    return _accumulate(lambda: gen.gamma(shape, scale, _CHUNK), n=n, duration_s=duration)


def constant(
    rate_per_s: float | str,
    *,
    seed: int | None = None,
    n: int | None = None,
    duration_s: float | str | None = None,
) -> np.ndarray:
    """Evenly spaced arrivals ``k / rate_per_s``. ``seed`` is accepted for a uniform call and unused."""
    rate = _rate(rate_per_s)
    n, duration = _bounds(n, duration_s, rate)
    if n is not None:
        return np.arange(n, dtype=np.float64) / rate
    times = np.arange(math.ceil(duration * rate) + 1, dtype=np.float64) / rate
    return times[times < duration]


def trace(
    path: str | Path,
    *,
    time_scale: float = 1.0,
    n: int | None = None,
    duration_s: float | str | None = None,
) -> np.ndarray:
    """Arrival times read from a file, sorted, rebased so the first is 0, then multiplied by ``time_scale``.

    Forms (chosen by extension, else by the first line):

    * plain text: one number of seconds per line (blank lines and ``#`` comments skipped);
    * ``.csv`` with a ``timestamp`` column (any case, as Azure's ``TIMESTAMP``): ISO datetimes
      (``2023-11-16 18:15:46.6805900``) or numbers of seconds;
    * ``.jsonl``: objects with a ``timestamp`` field in milliseconds (Mooncake traces), or in
      seconds when the first object has ``chat_id``/``parent_chat_id`` (Qwen-Bailian traces).

    ``time_scale`` 0.5 replays twice as fast. ``n`` takes the first n arrivals (an error if the trace
    holds fewer), ``duration_s`` those before that offset; neither takes the whole trace.
    """
    if (
        isinstance(time_scale, bool)
        or not isinstance(time_scale, int | float)
        or not (math.isfinite(time_scale) and time_scale > 0)
    ):
        raise WorkloadError(
            f"{path}: time_scale: {time_scale!r} is not allowed; use a number > 0 (0.5 replays twice as fast)"
        )
    if n is not None and duration_s is not None:
        raise WorkloadError("arrivals: both n and duration_s given; give exactly one of them")
    n = _count(n) if n is not None else None
    duration = _duration(duration_s) if duration_s is not None else None
    raw = _read_trace(Path(path))
    times = np.sort(raw)
    times = (times - times[0]) * float(time_scale)
    if n is not None:
        if n > len(times):
            raise WorkloadError(
                f"{path}: asked for {n} arrivals but the trace holds {len(times)}; ask for at most "
                f"{len(times)} or bound it by duration"
            )
        return times[:n]
    if duration is not None:
        return times[times < duration]
    return times


def rescale(
    offsets: np.ndarray, *, time_scale: float | None = None, rate_per_s: float | str | None = None
) -> np.ndarray:
    """Sorted offsets rebased to start at 0 and stretched: by ``time_scale``, or to a mean rate.

    ``rate_per_s`` multiplies every gap by one factor so that (n - 1) / span equals it: the trace's
    shape (bursts, lulls, the order of sessions) is kept, only its speed changes.
    """
    if (time_scale is None) == (rate_per_s is None):
        raise WorkloadError("arrivals: rescale: give exactly one of time_scale or rate_per_s")
    times = np.sort(np.asarray(offsets, dtype=np.float64))
    if len(times) == 0:
        return times
    times = times - times[0]
    if time_scale is not None:
        if isinstance(time_scale, bool) or not (math.isfinite(time_scale) and time_scale > 0):
            raise WorkloadError(f"arrivals: time_scale {time_scale!r} is not allowed; use a number > 0")
        return times * float(time_scale)
    rate = _rate(rate_per_s)  # type: ignore[arg-type]
    span = float(times[-1])
    if len(times) < 2 or span <= 0:
        raise WorkloadError("arrivals: cannot rescale a trace to a rate: all its arrivals are at one instant")
    return times * ((len(times) - 1) / span / rate)


def schedule(
    kind: str,
    *,
    rate_per_s: float | str | None = None,
    burstiness: float = 1.0,
    seed: int = 0,
    n: int | None = None,
    duration_s: float | str | None = None,
    path: str | Path | None = None,
    time_scale: float = 1.0,
) -> np.ndarray:
    """Dispatch to :func:`poisson`, :func:`gamma`, :func:`constant` or :func:`trace` by ``kind``."""
    if kind not in ARRIVAL_KINDS:
        raise WorkloadError(f"arrivals: unknown kind {kind!r}; use one of {', '.join(ARRIVAL_KINDS)}")
    if kind == "trace":
        if path is None:
            raise WorkloadError("arrivals: trace: missing path; give the trace file")
        return trace(path, time_scale=time_scale, n=n, duration_s=duration_s)
    if rate_per_s is None:
        raise WorkloadError(f"arrivals: {kind}: missing rate_per_s; use {RATE_FORM}")
    if kind == "poisson":
        return poisson(rate_per_s, seed=seed, n=n, duration_s=duration_s)
    if kind == "gamma":
        return gamma(rate_per_s, burstiness, seed=seed, n=n, duration_s=duration_s)
    return constant(rate_per_s, seed=seed, n=n, duration_s=duration_s)


def worker_share(schedule_len_or_array: int | np.ndarray, n_workers: int, slot: int) -> np.ndarray:
    """Indices k of the schedule this worker runs: ``k % n_workers == slot`` (int64, ascending).

    The shares of slots ``0 .. n_workers-1`` are disjoint and together are every index once.
    """
    if isinstance(schedule_len_or_array, np.ndarray | list | tuple):
        length = len(schedule_len_or_array)
    else:
        length = _count(schedule_len_or_array, name="schedule length", at_least=0)
    if isinstance(n_workers, bool) or not isinstance(n_workers, int | np.integer) or n_workers < 1:
        raise WorkloadError(f"arrivals: n_workers {n_workers!r} is not allowed; use an integer >= 1")
    if isinstance(slot, bool) or not isinstance(slot, int | np.integer) or not 0 <= slot < n_workers:
        raise WorkloadError(
            f"arrivals: slot {slot!r} is not allowed; use an integer from 0 to {n_workers - 1}"
        )
    return np.arange(slot, length, n_workers, dtype=np.int64)


# --- helpers ---------------------------------------------------------------------------------------


def _rate(rate_per_s: float | str) -> float:
    try:
        return parse_rate_per_s(rate_per_s)
    except ValueError:
        raise WorkloadError(
            f"arrivals: rate_per_s: {rate_per_s!r} is not allowed; use {RATE_FORM} greater than 0"
        ) from None


def _duration(duration_s: float | str) -> float:
    try:
        value = parse_duration_s(duration_s)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise WorkloadError(f"arrivals: duration_s: {duration_s!r} is not allowed; use {DURATION_FORM}, > 0")
    return value


def _count(n: int, *, name: str = "n", at_least: int = 1) -> int:
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < at_least:
        raise WorkloadError(f"arrivals: {name}: {n!r} is not allowed; use an integer >= {at_least}")
    return int(n)


def _bounds(n: int | None, duration_s: float | str | None, rate: float) -> tuple[int | None, float | None]:
    if n is None and duration_s is None:
        raise WorkloadError(
            "arrivals: neither n nor duration_s given; give exactly one to bound the schedule"
        )
    if n is not None and duration_s is not None:
        raise WorkloadError("arrivals: both n and duration_s given; give exactly one of them")
    if n is not None:
        count = _count(n)
        if count > MAX_ARRIVALS:
            raise WorkloadError(f"arrivals: n: {count} is more than {MAX_ARRIVALS:,} arrivals; ask for fewer")
        return count, None
    duration = _duration(duration_s)
    if duration * rate > MAX_ARRIVALS:
        raise WorkloadError(
            f"arrivals: rate x duration = {duration * rate:,.0f} arrivals is more than {MAX_ARRIVALS:,}; "
            "lower the rate or the duration"
        )
    return None, duration


def _generator(seed: int) -> np.random.Generator:
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise WorkloadError(f"arrivals: seed {seed!r} is not allowed; use an integer >= 0")
    return np.random.default_rng(np.random.SeedSequence(int(seed)))


def _accumulate(draw: Callable[[], np.ndarray], *, n: int | None, duration_s: float | None) -> np.ndarray:
    """Times 0, g1, g1+g2, ... from chunks of gaps, cut at n arrivals or before duration_s."""
    chunks: list[np.ndarray] = []
    if n is not None:
        need = n - 1
        while sum(len(c) for c in chunks) < need:
            chunks.append(draw())
        gaps = np.concatenate(chunks)[:need] if chunks else np.empty(0)
        return np.concatenate(([0.0], np.cumsum(gaps)))
    assert duration_s is not None
    total = 0.0
    while True:
        while total < duration_s:
            chunk = draw()
            chunks.append(chunk)
            total += float(chunk.sum())
        times = np.concatenate(([0.0], np.cumsum(np.concatenate(chunks))))
        if times[-1] >= duration_s:  # the chunk sums above are pairwise; confirm on the exact sum
            return times[times < duration_s]
        total = float(times[-1])


# --- trace files -----------------------------------------------------------------------------------


def _read_trace(path: Path) -> np.ndarray:
    try:
        text = universal_newlines(read_bytes(path).decode("utf-8-sig"))  # gzip/zstd told by content
    except (OSError, UnicodeDecodeError) as e:
        reason = getattr(e, "strerror", None) or str(e)
        raise WorkloadError(f"{path}: cannot read the trace ({reason}); give a readable text file") from None
    lines = text.splitlines()
    first = next((ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")), None)
    if first is None:
        raise WorkloadError(f"{path}: the trace holds no timestamps; give one per line, a CSV or JSONL")
    suffix = data_suffix(path)
    if suffix == ".jsonl" or (suffix != ".csv" and first.startswith("{")):
        values = _jsonl_timestamps(path, lines)
    elif suffix == ".csv" or not _is_number(first):
        values = _csv_timestamps(path, text)
    else:
        values = _plain_timestamps(path, lines)
    if not values:
        raise WorkloadError(f"{path}: the trace holds no timestamps; give one per line, a CSV or JSONL")
    return np.asarray(values, dtype=np.float64)


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def _plain_timestamps(path: Path, lines: list[str]) -> list[float]:
    out: list[float] = []
    for lineno, line in enumerate(lines, start=1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        if not _is_number(s):
            raise WorkloadError(
                f"{path} line {lineno}: {s[:40]!r} is not a number; give seconds, one per line"
            )
        out.append(float(s))
    return out


def _jsonl_timestamps(path: Path, lines: list[str]) -> list[float]:
    out: list[float] = []
    unit, per_s = "milliseconds", 1000.0  # Mooncake; a Qwen-Bailian trace (chat_id keys) is in seconds
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise WorkloadError(
                f"{path} line {lineno}: not valid JSON ({e.msg}); give one object per line"
            ) from None
        ts = obj.get("timestamp") if isinstance(obj, dict) else None
        if not out and isinstance(obj, dict) and ("chat_id" in obj or "parent_chat_id" in obj):
            unit, per_s = "seconds", 1.0
        if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts):
            raise WorkloadError(
                f"{path} line {lineno}: timestamp: {ts!r} is not allowed; give a number of {unit}"
            )
        out.append(ts / per_s)
    return out


def _csv_timestamps(path: Path, text: str) -> list[float]:
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None) or []
    cols = [i for i, name in enumerate(header) if name.strip().lower() == "timestamp"]
    if not cols:
        raise WorkloadError(
            f"{path} line 1: no timestamp column (found {', '.join(h.strip() for h in header)[:60]}); "
            "give a CSV whose header names a timestamp column"
        )
    col = cols[0]
    cells = (
        (lineno, row[col].strip() if col < len(row) else "")
        for lineno, row in enumerate(reader, start=2)
        if row and any(cell.strip() for cell in row)
    )
    return csv_time_values(path, cells)


def csv_time_values(path: Path | str, cells: Iterable[tuple[int, str]]) -> list[float]:
    """Seconds from (line number, cell) pairs: all numbers of seconds, or all ISO datetimes.

    Datetimes count from the first one (Azure's ``2023-11-16 18:15:46.6805900``); a file that mixes
    the two, or times with and without a zone, is an error naming the line.
    """
    out: list[float] = []
    origin: datetime | None = None
    for lineno, cell in cells:
        if _is_number(cell):
            if origin is not None:
                raise WorkloadError(f"{path} line {lineno}: timestamp: {cell!r} mixes numbers with datetimes")
            out.append(float(cell))
            continue
        try:
            dt = datetime.fromisoformat(cell)
        except ValueError:
            raise WorkloadError(
                f"{path} line {lineno}: timestamp: {cell[:40]!r} is not a time; use an ISO datetime "
                "(2023-11-16 18:15:46.68) or seconds"
            ) from None
        if origin is None:
            if out:
                raise WorkloadError(f"{path} line {lineno}: timestamp: {cell!r} mixes datetimes with numbers")
            origin = dt
        try:
            out.append((dt - origin).total_seconds())
        except TypeError:
            raise WorkloadError(
                f"{path} line {lineno}: timestamp: {cell!r} mixes times with and without a time zone"
            ) from None
    return out
