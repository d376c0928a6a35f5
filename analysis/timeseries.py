"""Figures over time for the run report: throughput, in-flight sessions and requests, and latency or
schedule-lag percentiles per interval. Times are seconds since the run's start.

Throughput and in-flight counts come from the records (exact times); percentiles per interval come
from ``metrics.hlog`` (one merged histogram per interval, across tags) when the run has it, else
from the records bucketed by completion time. Either way a percentile is loadgen's one percentile
(``analysis.hdr.percentile_values`` over an HDR histogram, docs/metrics.md): records are recorded
into a histogram by the results format's recording rule (``records.metric_values``) first, so a
plotted p99 is what summary.json would say for the same requests.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from analysis import hdr, hlog
from analysis.records import RequestRecord, metric_values, parse_histogram_tag
from analysis.results import RunResults, record_end_us


@dataclass(frozen=True)
class TimeSeries:
    t_s: list[float]
    values: dict[str, list[float | None]]


def bucket_width_s(span_s: float, *, target_points: int = 100) -> float:
    """A round bucket width (0.1, 0.2, 0.5, 1, 2, 5, 10 ... s) giving about ``target_points`` buckets."""
    raw = max(span_s, 1e-3) / target_points
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if raw <= m * mag:
            return max(0.1, m * mag)
    return max(0.1, 10 * mag)


def span_s(res: RunResults) -> float:
    ends = [record_end_us(r) / 1e6 for r in res.records]
    hl = [iv.end_s for iv in res.hlog.intervals] if res.hlog else []
    return max([res.window.end_s, *ends, *hl, 1.0])


def throughput(records: list[RequestRecord], width_s: float, until_s: float) -> TimeSeries:
    """Per bucket of completion time: successful requests/s, output tokens/s and errors/s."""
    n = max(1, math.ceil(until_s / width_s))
    req, tok, err = np.zeros(n), np.zeros(n), np.zeros(n)
    for r in records:
        k = min(n - 1, int(record_end_us(r) / 1e6 // width_s))
        if r.ok:
            req[k] += 1
            tok[k] += r.output_tokens
        else:
            err[k] += 1
    t = [(k + 0.5) * width_s for k in range(n)]
    return TimeSeries(
        t,
        {
            "requests/s": list(req / width_s),
            "output tokens/s": list(tok / width_s),
            "errors/s": list(err / width_s),
        },
    )


def in_flight(records: list[RequestRecord], width_s: float, until_s: float) -> TimeSeries:
    """Sessions in flight (first intended start to last end, think time included) and requests in
    flight (sent to finished), sampled at each bucket's middle."""
    sessions: dict[str, list[float]] = {}
    req_events = []
    for r in records:
        start, end = r.t_sched_us / 1e6, record_end_us(r) / 1e6
        s = sessions.setdefault(r.session_id, [start, end])
        s[0], s[1] = min(s[0], start), max(s[1], end)
        req_events.append((r.t_send_us / 1e6, end))
    t = np.arange(max(1, math.ceil(until_s / width_s))) * width_s + width_s / 2
    return TimeSeries(
        list(t), {"sessions": _active(list(sessions.values()), t), "requests": _active(req_events, t)}
    )


def _active(spans, t: np.ndarray) -> list[float]:
    if not spans:
        return [0.0] * len(t)
    a = np.asarray(spans, dtype=float)
    starts, ends = np.sort(a[:, 0]), np.sort(a[:, 1])
    return list(
        (np.searchsorted(starts, t, side="right") - np.searchsorted(ends, t, side="right")).astype(float)
    )


def interval_percentiles(
    res: RunResults, metric: str, percentiles=(50.0, 99.0), *, max_points: int = 150
) -> TimeSeries:
    """``metric``'s percentiles (ms) per interval across every tag; from the hlog when present."""
    if res.hlog is not None and res.hlog.intervals:
        return _from_hlog(res.hlog, metric, percentiles, max_points)
    return _from_records(
        res.records, metric, percentiles, bucket_width_s(span_s(res), target_points=max_points)
    )


def _from_hlog(log: hlog.Hlog, metric: str, percentiles, max_points: int) -> TimeSeries:
    by_start: dict[float, list[hlog.Interval]] = defaultdict(list)
    for iv in log.intervals:
        if parse_histogram_tag(iv.tag)[0] == metric:
            by_start[round(iv.start_s, 3)].append(iv)
    starts = sorted(by_start)
    if not starts:
        return TimeSeries([], {f"p{p:g}": [] for p in percentiles})
    group = max(1, math.ceil(len(starts) / max_points))  # merge neighbours on long runs
    t, cols = [], {f"p{p:g}": [] for p in percentiles}
    for i in range(0, len(starts), group):
        ivs = [iv for s in starts[i : i + group] for iv in by_start[s]]
        h = hlog.merge(iv.histogram() for iv in ivs)
        t.append((min(iv.start_s for iv in ivs) + max(iv.end_s for iv in ivs)) / 2)
        for p, v in zip(percentiles, hdr.value_at_percentiles(hdr.bins(h), percentiles), strict=True):
            cols[f"p{p:g}"].append(v / 1000.0)
    return TimeSeries(t, cols)


def _from_records(records: list[RequestRecord], metric: str, percentiles, width_s: float) -> TimeSeries:
    buckets: dict[int, list[int]] = defaultdict(list)
    for r in records:
        vals = _record_values(r, metric)
        if vals:
            buckets[int(record_end_us(r) / 1e6 // width_s)].extend(vals)
    keys = sorted(buckets)
    cols: dict[str, list[float | None]] = {f"p{p:g}": [] for p in percentiles}
    for k in keys:
        for p, v in zip(percentiles, _percentiles_us(buckets[k], percentiles), strict=True):
            cols[f"p{p:g}"].append(v / 1000.0)
    return TimeSeries([(k + 0.5) * width_s for k in keys], cols)


def _record_values(r: RequestRecord, metric: str) -> list[int]:
    """The values ``r`` adds to ``metric``'s histogram: the recording rule of ``records.metric_values``
    (which yields each metric's values together, so the walk stops after them)."""
    out: list[int] = []
    for m, v in metric_values(r):
        if m == metric:
            out.append(v)
        elif out:
            break
    return out


def _percentiles_us(values_us, percentiles) -> list[int]:
    """``percentiles`` of ``values_us`` as summary.json computes them: recorded (rounded, clamped to
    1 µs .. 1 h) into an HDR histogram and read with ``hdr.percentile_values``."""
    return hdr.percentile_values(hlog.record_clamped(hlog.new_histogram(), values_us), percentiles)


def ttft_by_turn(
    records: list[RequestRecord], percentiles=(50.0, 90.0, 99.0), *, min_count: int = 3
) -> TimeSeries:
    """TTFT percentiles (ms) per turn index, over successful requests (HDR percentiles, as
    summary.json's); turns with fewer than ``min_count`` requests are left out (their percentiles
    would be noise)."""
    by_turn: dict[int, list[int]] = defaultdict(list)
    for r in records:
        if vals := _record_values(r, "ttft"):
            by_turn[r.turn_index].extend(vals)
    turns = [k for k in sorted(by_turn) if len(by_turn[k]) >= min_count]
    cols: dict[str, list[float | None]] = {f"p{p:g}": [] for p in percentiles}
    for k in turns:
        for p, v in zip(percentiles, _percentiles_us(by_turn[k], percentiles), strict=True):
            cols[f"p{p:g}"].append(v / 1000.0)
    cols["count"] = [float(len(by_turn[k])) for k in turns]
    return TimeSeries([float(k) for k in turns], cols)


__all__ = [
    "TimeSeries",
    "bucket_width_s",
    "in_flight",
    "interval_percentiles",
    "span_s",
    "throughput",
    "ttft_by_turn",
]
