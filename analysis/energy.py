"""Energy over a run's measurement window, from the GPU power samples in ``power.jsonl``.

``loadgen run --power-metrics`` scrapes each GPU host's exporter about once a second and appends
one line per scrape: the time, the power summed over its GPUs (W), the
joules its energy counters rose by since the first scrape (resets handled), or the one-line error
of a failed scrape. From those lines, per endpoint:

- with an energy counter: the energy at each end of the window, interpolated linearly between
  the two scrapes around it, and their difference (the counter is exact between scrapes; only the
  ends are interpolated);
- else: the power gauge integrated over the window by the trapezoid rule, its value at each end
  interpolated the same way.

An endpoint whose scrapes do not reach both ends of the window gives no figure (a note says
why): a total that left out a GPU host would be a false figure. Definitions: docs/metrics.md
"Energy".
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import orjson

POWER_FILE = "power.jsonl"
COUNTER, TRAPEZOID = "energy counter", "power gauge (trapezoid)"


@dataclass
class SourceSeries:
    """One endpoint's scrapes, in time order."""

    name: str
    url: str = ""
    target: str | None = None
    times_s: list[float] = field(default_factory=list)  # Unix seconds of good scrapes
    power_w: list[float] = field(default_factory=list)
    energy_j: list[float | None] = field(default_factory=list)
    failed: int = 0
    last_error: str | None = None

    def add(self, t_s: float, power_w: float, energy_j: float | None) -> None:
        if self.times_s and t_s <= self.times_s[-1]:
            return  # a clock step back: keep the series monotonic rather than invent an order
        self.times_s.append(t_s)
        self.power_w.append(power_w)
        self.energy_j.append(energy_j)


@dataclass(frozen=True)
class WindowEnergy:
    """An endpoint's energy over the window, or why there is none (``energy_j`` None, ``why`` set)."""

    energy_j: float | None
    method: str | None
    why: str | None = None


def read_power_file(path: str | Path) -> dict[str, SourceSeries]:
    """The series in a ``power.jsonl`` (a torn last line, from a killed run, is skipped)."""
    out: dict[str, SourceSeries] = {}
    try:
        raw = Path(path).read_bytes()
    except OSError:
        return out
    for line in raw.splitlines():
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(row, dict) or not isinstance(row.get("source"), str):
            continue
        s = out.setdefault(row["source"], SourceSeries(row["source"]))
        s.url = str(row.get("url") or s.url)
        s.target = row.get("target") if isinstance(row.get("target"), str) else s.target
        if row.get("error"):
            s.failed += 1
            s.last_error = str(row["error"])[:300]
            continue
        t, p, e = row.get("t_unix_s"), row.get("power_w"), row.get("energy_j")
        if isinstance(t, int | float) and isinstance(p, int | float):
            s.add(float(t), float(p), float(e) if isinstance(e, int | float) else None)
    return out


def _at(times: list[float], values: list[float], t: float) -> float | None:
    """``values`` interpolated linearly at ``t``; None outside the scrapes' span."""
    if not times or t < times[0] or t > times[-1]:
        return None
    i = bisect_left(times, t)
    if times[i] == t:
        return values[i]
    t0, t1, v0, v1 = times[i - 1], times[i], values[i - 1], values[i]
    return v0 + (v1 - v0) * (t - t0) / (t1 - t0)


def energy_between(s: SourceSeries, start_s: float, end_s: float) -> WindowEnergy:
    """The energy of ``s`` over [start_s, end_s] (Unix seconds): see the module docstring."""
    if end_s <= start_s:
        return WindowEnergy(None, None, "the measurement window is empty")
    if not s.times_s:
        why = f"every scrape failed ({s.last_error})" if s.failed else "no scrape"
        return WindowEnergy(None, None, why)
    failed = f" ({s.failed} scrapes failed, the last: {s.last_error})" if s.failed else ""
    if s.times_s[0] > start_s:
        return WindowEnergy(None, None, f"no scrape before the window's start (the first was {s.times_s[0] - start_s:.1f} s after it){failed}")
    if s.times_s[-1] < end_s:
        return WindowEnergy(None, None, f"no scrape after the window's end (the last was {end_s - s.times_s[-1]:.1f} s before it){failed}")
    # The counter where every scrape in reach of the window has it (a page that lost it midway
    # is integrated from its power instead: a counter series with holes is no counter).
    lo = max(0, bisect_left(s.times_s, start_s) - 1)
    hi = bisect_left(s.times_s, end_s) + 1
    span = slice(lo, hi)
    energies = s.energy_j[span]
    if all(e is not None for e in energies):
        times = s.times_s[span]
        vals = [float(e) for e in energies if e is not None]
        a, b = _at(times, vals, start_s), _at(times, vals, end_s)
        if a is not None and b is not None:
            return WindowEnergy(max(0.0, b - a), COUNTER)
    return WindowEnergy(trapezoid(s.times_s, s.power_w, start_s, end_s), TRAPEZOID)


def trapezoid(times: list[float], power_w: list[float], start_s: float, end_s: float) -> float:
    """∫ power dt over [start_s, end_s], the power linear between scrapes (the trapezoid rule)."""
    p_start, p_end = _at(times, power_w, start_s), _at(times, power_w, end_s)
    if p_start is None or p_end is None:
        raise ValueError("the scrapes do not cover the window")
    pts = [(start_s, p_start), *((t, p) for t, p in zip(times, power_w, strict=True) if start_s < t < end_s), (end_s, p_end)]
    return sum((t1 - t0) * (p0 + p1) / 2.0 for (t0, p0), (t1, p1) in pairwise(pts))


def energy_figures(energy_j: float | None, window_s: float, output_tokens: int | None) -> dict[str, Any]:
    """Average power, energy, tokens per joule and joules per 1M output tokens (None when unknown)."""
    out: dict[str, Any] = {
        "energy_j": _r(energy_j),
        "average_power_w": _r(energy_j / window_s) if energy_j is not None and window_s > 0 else None,
        "output_tokens": output_tokens,
        "output_tokens_per_joule": None,
        "joules_per_1m_output_tokens": None,
    }
    if energy_j is not None and output_tokens is not None:
        out["output_tokens_per_joule"] = _r(output_tokens / energy_j, 6) if energy_j > 0 else None
        out["joules_per_1m_output_tokens"] = _r(energy_j / output_tokens * 1e6) if output_tokens > 0 else None
    return out


@dataclass
class RunEnergy:
    """The ``energy`` sections of a summary: the total, and per target with endpoints tied to it."""

    total: dict[str, Any] | None
    by_target: dict[str, dict[str, Any]]
    notes: list[str]


def run_energy(
    run_dir: str | Path,
    t0_unix_s: float | None,
    window: tuple[float, float],
    output_tokens: int | None,
    output_tokens_by_target: dict[str, int],
) -> RunEnergy | None:
    """Energy over the window ``(start_s, end_s)`` (seconds since the run's start) of every endpoint in
    ``run_dir/power.jsonl``; None when the run scraped no power."""
    path = Path(run_dir) / POWER_FILE
    if not path.exists():
        return None
    series = read_power_file(path)
    notes: list[str] = []
    if t0_unix_s is None:
        notes.append("energy: run.json has no t0_unix_s, so the power samples cannot be placed in the window")
        return RunEnergy(None, {}, notes)
    start, end = t0_unix_s + window[0], t0_unix_s + window[1]
    window_s = window[1] - window[0]
    per: dict[str, WindowEnergy] = {name: energy_between(s, start, end) for name, s in series.items()}
    sources = []
    for name, s in series.items():
        w = per[name]
        sources.append({
            "name": name, "url": s.url, "target": s.target, "method": w.method, "scrapes": len(s.times_s),
            "failed_scrapes": s.failed, **energy_figures(w.energy_j, window_s, None),
        })  # fmt: skip
        if w.why:
            notes.append(f"energy: --power-metrics {s.url or name}: no energy figure: {w.why}")
        elif s.failed:
            notes.append(f"energy: --power-metrics {s.url or name}: {s.failed} of {s.failed + len(s.times_s)} scrapes failed (last: {s.last_error})")
    total = _combined(per.values(), window_s, output_tokens) if series else energy_figures(None, window_s, output_tokens)
    total["sources"] = sources
    total["window_s"] = _r(window_s)
    by_target: dict[str, dict[str, Any]] = {}
    for target in sorted({s.target for s in series.values() if s.target}):
        tied = [per[n] for n, s in series.items() if s.target == target]
        group = _combined(tied, window_s, output_tokens_by_target.get(target))
        group["sources"] = [n for n, s in series.items() if s.target == target]
        by_target[target] = group
    return RunEnergy(total, by_target, notes)


def _combined(parts: Iterable[WindowEnergy], window_s: float, output_tokens: int | None) -> dict[str, Any]:
    parts = list(parts)
    known = [p.energy_j for p in parts if p.energy_j is not None]
    energy = float(sum(known)) if parts and len(known) == len(parts) else None  # all or nothing
    out = energy_figures(energy, window_s, output_tokens)
    methods = sorted({p.method for p in parts if p.method})
    out["method"] = methods[0] if len(methods) == 1 else ("mixed" if methods else None)
    return out


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(float(x), nd)


__all__ = ["COUNTER", "POWER_FILE", "TRAPEZOID", "RunEnergy", "SourceSeries", "energy_between", "energy_figures",
           "read_power_file", "run_energy", "trapezoid"]  # fmt: skip
