"""Sweep search: the largest arrival rate at which the percentile SLOs hold ("max goodput rate").

Pure search logic, independent of how a run is executed: the caller passes ``evaluate(rate) ->
summary dict`` (the runtime runs loadgen at that rate and summarizes it; tests pass a model).

* ``find_max_rate`` bisects between ``lo`` and ``hi``: it assumes that a rate that holds the SLOs
  makes every lower rate hold them too. It stops after ``steps`` halvings, or once the bracket is at
  most ``tolerance`` wide. The answer is the highest rate *seen* to hold, never an interpolation.
* ``grid`` evaluates given rates in increasing order; the answer is the highest rate below the first
  that fails (a later rate that holds again is noise or a cliff, and is reported as a note).

A rate holds when every percentile SLO holds (``slo.evaluate_percentile_slos``), the error rate
is at most ``max_error_rate`` (a server that sheds load with 429s would otherwise "hold" its
latency SLOs at any rate), and the generator kept up (a saturated generator's latencies include its
own delay, so the rate is not shown to hold: the answer stays a lower bound).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from analysis.slo import Slos, evaluate_percentile_slos, parse_slos
from analysis.summary_format import fmt_ms

DEFAULT_MAX_ERROR_RATE = 0.01
DEFAULT_STEPS = 6

Evaluate = Callable[[float], dict[str, Any]]


@dataclass(frozen=True)
class SweepPoint:
    """One evaluated rate: whether it held the SLOs, why not, and its summary."""

    rate_per_s: float
    ok: bool
    reasons: tuple[str, ...]
    summary: dict[str, Any] = field(repr=False)


@dataclass
class SweepResult:
    """Points in increasing rate; ``max_rate_per_s`` None when even the lowest rate failed."""

    method: str  # "bisect" | "grid"
    slos: list[str]
    points: list[SweepPoint]
    max_rate_per_s: float | None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the search, and per point its key figures (not the whole summary)."""
        return {
            "method": self.method,
            "slos": self.slos,
            "max_rate_per_s": self.max_rate_per_s,
            "notes": self.notes,
            "points": [
                {"rate_per_s": p.rate_per_s, "ok": p.ok, "reasons": list(p.reasons), **key_figures(p.summary)}
                for p in self.points
            ],
        }


def check_point(
    summary: dict[str, Any], slos: Slos, *, max_error_rate: float = DEFAULT_MAX_ERROR_RATE
) -> tuple[bool, list[str]]:
    """(holds, reasons it does not) for one summary."""
    reasons = []
    for slo, observed, ok in evaluate_percentile_slos(summary, slos):
        if not ok:
            reasons.append(f"{slo} missed ({'no data' if observed is None else f'{fmt_ms(observed)} ms'})")
    rate = (summary.get("errors") or {}).get("rate") or 0.0
    if rate > max_error_rate:
        reasons.append(f"error rate {rate:.2%} over {max_error_rate:.2%}")
    if summary.get("generator_saturated"):
        lag = (summary.get("generator") or {}).get("schedule_lag_p99_ms")
        reasons.append(f"generator saturated (schedule lag p99 {fmt_ms(lag)} ms): add workers")
    return not reasons, reasons


def find_max_rate(
    evaluate: Evaluate,
    slos: str | Iterable[str] | Slos,
    lo: float,
    hi: float,
    *,
    steps: int | None = None,
    tolerance: float | None = None,
    max_error_rate: float = DEFAULT_MAX_ERROR_RATE,
) -> SweepResult:
    """Bisect [lo, hi] for the largest rate (per second) that holds ``slos`` (see the module docstring).
    Give ``steps`` (halvings after the two ends) or ``tolerance`` (rate units), not both; default 6 steps."""
    slo_set = _percentile_slos(slos)
    if not 0 < lo < hi:
        raise ValueError(f"sweep needs 0 < lo < hi (got lo={lo}, hi={hi})")
    if steps is not None and tolerance is not None:
        raise ValueError("give steps or tolerance, not both")
    if tolerance is not None and tolerance <= 0:
        raise ValueError(f"tolerance must be > 0 (got {tolerance})")
    if steps is None and tolerance is None:
        steps = DEFAULT_STEPS
    points: list[SweepPoint] = []

    def run(rate: float) -> bool:
        summary = evaluate(rate)
        ok, reasons = check_point(summary, slo_set, max_error_rate=max_error_rate)
        points.append(SweepPoint(rate, ok, tuple(reasons), summary))
        return ok

    notes: list[str] = []
    best: float | None = None
    if not run(lo):
        notes.append(f"the SLOs fail already at the lowest rate ({lo:g}/s); lower lo")
    elif run(hi):
        best = hi
        notes.append(f"the SLOs hold at the highest rate ({hi:g}/s); raise hi to find the limit")
    else:
        best = lo
        k = 0
        while (steps is not None and k < steps) or (tolerance is not None and hi - lo > tolerance):
            mid = (lo + hi) / 2
            if run(mid):
                lo = best = mid
            else:
                hi = mid
            k += 1
        notes.append(f"the limit lies in [{lo:g}, {hi:g}]/s")
    return SweepResult("bisect", slo_set.texts(), sorted(points, key=lambda p: p.rate_per_s), best, notes)


def grid(
    evaluate: Evaluate,
    slos: str | Iterable[str] | Slos,
    rates: Iterable[float],
    *,
    max_error_rate: float = DEFAULT_MAX_ERROR_RATE,
) -> SweepResult:
    """Evaluate every rate (ascending); the answer is the highest rate below the first failure."""
    slo_set = _percentile_slos(slos)
    points = []
    for rate in sorted(set(rates)):
        summary = evaluate(rate)
        ok, reasons = check_point(summary, slo_set, max_error_rate=max_error_rate)
        points.append(SweepPoint(rate, ok, tuple(reasons), summary))
    best = None
    notes = []
    for i, p in enumerate(points):
        if not p.ok:
            later = [q.rate_per_s for q in points[i + 1 :] if q.ok]
            if later:
                notes.append(
                    f"{', '.join(f'{r:g}/s' for r in later)} held again after {p.rate_per_s:g}/s failed; not counted"
                )
            break
        best = p.rate_per_s
    return SweepResult("grid", slo_set.texts(), points, best, notes)


def key_figures(summary: dict[str, Any]) -> dict[str, Any]:
    """What a sweep table and plot show of one run's summary."""
    metrics = summary.get("metrics") or {}
    lat = {
        m: {s: (metrics.get(m) or {}).get(s) for s in ("p50", "p90", "p99")}
        for m in ("ttft", "tpot", "itl", "e2e")
        if m in metrics
    }
    tp = summary.get("throughput") or {}
    slo = summary.get("slo") or {}
    cost = summary.get("cost") or {}
    return {
        "run_id": summary.get("run_id"),
        "latency_ms": lat,
        "requests_per_s": tp.get("requests_per_s"),
        "output_tokens_per_s": tp.get("output_tokens_per_s"),
        "goodput_requests_per_s": slo.get("goodput_requests_per_s"),
        "goodput_tokens_per_s": slo.get("goodput_tokens_per_s"),
        "attainment": slo.get("attainment"),
        "error_rate": (summary.get("errors") or {}).get("rate"),
        "generator_saturated": summary.get("generator_saturated"),
        "cost_per_hour_usd": cost.get("cost_per_hour_usd"),
        "output_tokens_per_usd": cost.get("output_tokens_per_usd"),
        "goodput_tokens_per_usd": cost.get("goodput_tokens_per_usd"),
    }


def format_sweep(result: SweepResult) -> str:
    """A terminal table of the points and the answer."""
    head = f"{'rate/s':>9}  {'holds':<5}  {'ttft p99':>9}  {'itl p99':>8}  {'tpot p99':>8}  {'out tok/s':>10}  {'goodput/s':>9}  why not"
    lines = [f"sweep ({result.method}) for {', '.join(result.slos)}", head]
    for p in result.points:
        f = key_figures(p.summary)
        lat = f["latency_ms"]
        lines.append(
            f"{p.rate_per_s:>9.3g}  {'yes' if p.ok else 'no':<5}  {fmt_ms(lat.get('ttft', {}).get('p99')):>9}  "
            f"{fmt_ms(lat.get('itl', {}).get('p99')):>8}  {fmt_ms(lat.get('tpot', {}).get('p99')):>8}  "
            f"{_num(f['output_tokens_per_s']):>10}  {_num(f['goodput_requests_per_s']):>9}  {'; '.join(p.reasons)}".rstrip()
        )
    lines.append(describe_max(result))
    lines += [f"note: {n}" for n in result.notes]
    return "\n".join(lines)


def point_at(result: SweepResult, rate_per_s: float | None) -> SweepPoint | None:
    """The evaluated point at ``rate_per_s`` (the last one, should a rate have run twice)."""
    found = [p for p in result.points if p.rate_per_s == rate_per_s]
    return found[-1] if found else None


def describe_max(result: SweepResult) -> str:
    """``max rate holding the SLOs: 8/s; there goodput 7.9 requests/s (1,010 tokens/s), 252,000 output tokens/$``."""
    best = point_at(result, result.max_rate_per_s)
    if best is None:
        return "max rate holding the SLOs: none: the SLOs fail at every rate tried"
    f = key_figures(best.summary)
    if f["goodput_requests_per_s"] is None:
        good = "goodput - (no per-request SLO)"
    else:
        good = f"goodput {_num(f['goodput_requests_per_s'])} requests/s ({_num(f['goodput_tokens_per_s'])} tokens/s)"
    if f["output_tokens_per_usd"] is None:
        cost = "tokens/$ - (no cost per hour)"
    else:
        cost = f"{f['output_tokens_per_usd']:,.0f} output tokens/$"
        if f["goodput_tokens_per_usd"] is not None:
            cost += f" ({f['goodput_tokens_per_usd']:,.0f} good)"
    return f"max rate holding the SLOs: {best.rate_per_s:g}/s; there {good}, {cost}"


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:,.1f}"


def _percentile_slos(slos: str | Iterable[str] | Slos) -> Slos:
    s = parse_slos(slos)
    if not s.percentile:
        raise ValueError("a sweep needs at least one percentile SLO, e.g. ttft_p99=500ms,itl_p99=50ms")
    return s


__all__ = [
    "SweepPoint",
    "SweepResult",
    "check_point",
    "describe_max",
    "find_max_rate",
    "format_sweep",
    "grid",
    "key_figures",
    "point_at",
]
