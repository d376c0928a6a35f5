"""Sweep search: the largest arrival rate at which the percentile SLOs hold ("max goodput rate").

Pure search logic, independent of how a run is executed: the caller passes ``evaluate(rate) ->
summary dict`` (the runtime runs loadgen at that rate and summarizes it, adding the run's process
``exit_code``; tests pass a model).

Each point has one of four outcomes (``judge_point``):

* ``holds``: every percentile SLO holds and the error rate is at most ``max_error_rate`` (a server
  that sheds load with 429s would otherwise "hold" its latency SLOs at any rate);
* ``slo``: the *server* missed: an SLO or the error rate, measured by a generator that kept up;
* ``generator``: the generator could not keep up (summary ``generator.saturated``, exit code 4, or
  its own network failing): its latencies include its own delay and the server saw less load than
  asked, so the point says nothing about the server, whatever its SLOs say;
* ``incomplete``: the run did not complete (run.json status not ``complete``) or is invalid (exit
  code 5): neither pass nor fail.

* ``find_max_rate`` bisects between ``lo`` and ``hi``: it assumes that a rate that holds the SLOs
  makes every lower rate hold them too (and that a generator behind at one rate is behind at every
  higher one). It stops after ``steps`` halvings, or once the bracket is at most ``tolerance``
  wide. The answer is the highest rate *seen* to hold, never an interpolation. A point the
  generator could not measure is not a miss of the server's: the search goes on below it (nothing
  above it can be measured with these workers), and when the lowest rate that did not hold is such
  a point the answer says "inconclusive above X/s: the generator was the limit (add workers)". An
  incomplete point is passed over the same way. The server's limit is named only from points where
  the server missed.
* ``grid`` evaluates given rates in increasing order; the answer is the highest rate below the first
  that does not hold (a later rate that holds again is noise or a cliff, and is reported as a note).

``SweepResult.limited_by`` says what bounds the answer from above (``slo``, ``generator``,
``incomplete``, or ``range``: it held at the highest rate tried) and ``SweepResult.exit_code`` is the
sweep's: 0 the server's limit found (or the SLOs hold at the top of the range), 3 the server missed
at every rate, 4 the generator was the limit, 5 a point was incomplete.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from analysis.metric_registry import SWEEP, metrics_for
from analysis.slo import Slos, evaluate_percentile_slos, parse_slos
from analysis.summary_format import fmt_ms

DEFAULT_MAX_ERROR_RATE = 0.01
DEFAULT_STEPS = 6

HOLDS = "holds"
SLO_MISSED = "slo"  # the server missed an SLO or the error rate
GENERATOR_LIMITED = "generator"  # the generator could not keep up: says nothing about the server
INCOMPLETE = "incomplete"  # the run did not complete: neither pass nor fail
RANGE = "range"  # limited_by when the SLOs hold at the highest rate tried
OUTCOMES = (HOLDS, SLO_MISSED, GENERATOR_LIMITED, INCOMPLETE)
# A point's exit codes (loadgen/runtime/verdict.py) that decide its outcome by themselves.
EXIT_GENERATOR = 4
EXIT_INCOMPLETE = 5

Evaluate = Callable[[float], dict[str, Any]]


@dataclass(frozen=True)
class SweepPoint:
    """One evaluated rate: whether it held the SLOs, its outcome (``OUTCOMES``), why not, and its summary."""

    rate_per_s: float
    ok: bool
    reasons: tuple[str, ...]
    summary: dict[str, Any] = field(repr=False)
    outcome: str = ""  # "" : from ``ok`` (holds, or the server missed)

    def __post_init__(self) -> None:
        if not self.outcome:
            object.__setattr__(self, "outcome", HOLDS if self.ok else SLO_MISSED)


@dataclass
class SweepResult:
    """Points in increasing rate; ``max_rate_per_s`` (the highest rate seen to hold) None when none
    held; ``limited_by`` what bounds it from above (see the module docstring); ``server_limit_per_s``
    the lowest rate at which the server missed, if any."""

    method: str  # "bisect" | "grid"
    slos: list[str]
    points: list[SweepPoint]
    max_rate_per_s: float | None
    notes: list[str] = field(default_factory=list)
    limited_by: str | None = None
    server_limit_per_s: float | None = None

    @property
    def exit_code(self) -> int:
        """0 the answer is the server's (or the SLOs hold at the top); 3 the server missed at every
        rate; 4 the generator was the limit; 5 a point was incomplete."""
        if self.limited_by == INCOMPLETE:
            return EXIT_INCOMPLETE
        if self.limited_by == GENERATOR_LIMITED:
            return EXIT_GENERATOR
        return 0 if self.max_rate_per_s is not None else 3

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the search, and per point its key figures (not the whole summary)."""
        return {
            "method": self.method,
            "slos": self.slos,
            "max_rate_per_s": self.max_rate_per_s,
            "limited_by": self.limited_by,
            "server_limit_per_s": self.server_limit_per_s,
            "exit_code": self.exit_code,
            "answer": describe_max(self),
            "notes": self.notes,
            "points": [
                {"rate_per_s": p.rate_per_s, "ok": p.ok, "outcome": p.outcome, "reasons": list(p.reasons),
                 "exit_code": p.summary.get("exit_code"), **key_figures(p.summary)}
                for p in self.points
            ],
        }  # fmt: skip


def judge_point(
    summary: dict[str, Any],
    slos: Slos,
    *,
    max_error_rate: float = DEFAULT_MAX_ERROR_RATE,
    exit_code: int | None = None,
) -> tuple[str, list[str]]:
    """(outcome, reasons it does not hold) for one summary; ``exit_code`` (default: the summary's
    ``exit_code``, which the sweep adds) is the run's process exit code. See the module docstring."""
    code = summary.get("exit_code") if exit_code is None else exit_code
    if summary.get("partial") or summary.get("status") == "aborted" or code == EXIT_INCOMPLETE:
        why = summary.get("partial_reason") or f"the run was incomplete or invalid (exit {code})"
        return INCOMPLETE, [f"incomplete, neither pass nor fail: {why}"]
    server: list[str] = []
    for slo, observed, ok in evaluate_percentile_slos(summary, slos):
        if not ok:
            server.append(f"{slo} missed ({'no data' if observed is None else f'{fmt_ms(observed)} ms'})")
    errors = summary.get("errors") or {}
    rate = errors.get("rate") or 0.0
    total = errors.get("total") or 0
    own = errors.get("generator_network") or 0  # the request never left: not the server's error
    own_rate = rate * own / total if total else 0.0
    if rate - own_rate > max_error_rate:
        server.append(f"error rate {rate - own_rate:.2%} over {max_error_rate:.2%}")
    gen = summary.get("generator") or {}
    generator: list[str] = []
    if gen.get("saturated") or summary.get("generator_saturated"):
        signals = (
            ", ".join(gen.get("saturated_by") or [])
            or f"schedule lag p99 {fmt_ms(gen.get('schedule_lag_p99_ms'))} ms"
        )
        generator.append(f"generator saturated ({signals}): add workers")
    elif code == EXIT_GENERATOR:
        generator.append(f"the generator failed (exit {EXIT_GENERATOR}): see the run's verdict")
    if own_rate > max_error_rate:
        generator.append(f"the generator's own network failed {own_rate:.2%} of requests")
    if generator:
        # What the SLOs say is kept, but it is not the server's: the generator was behind.
        return GENERATOR_LIMITED, generator + server
    return (SLO_MISSED, server) if server else (HOLDS, [])


def check_point(
    summary: dict[str, Any], slos: Slos, *, max_error_rate: float = DEFAULT_MAX_ERROR_RATE
) -> tuple[bool, list[str]]:
    """(holds, reasons it does not) for one summary (``judge_point`` says whose fault it was)."""
    outcome, reasons = judge_point(summary, slos, max_error_rate=max_error_rate)
    return outcome == HOLDS, reasons


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

    def run(rate: float) -> str:
        p = _point(rate, evaluate(rate), slo_set, max_error_rate)
        points.append(p)
        return p.outcome

    notes: list[str] = []
    best: float | None = None
    first = run(lo)
    limited_by: str | None = first
    if first == HOLDS:
        best = lo
        limited_by = run(hi)
        if limited_by == HOLDS:
            best, limited_by = hi, RANGE
            notes.append(f"the SLOs hold at the highest rate ({hi:g}/s); raise hi to find the limit")
        else:
            k = 0
            while (steps is not None and k < steps) or (tolerance is not None and hi - lo > tolerance):
                mid = (lo + hi) / 2
                outcome = run(mid)
                if outcome == HOLDS:
                    lo = best = mid
                else:
                    # A server miss bounds the limit. A generator behind at mid is behind at every
                    # higher rate too, and an incomplete run judges nothing: either way nothing
                    # above mid is judged, so the search goes on below it and the answer says so.
                    hi, limited_by = mid, outcome
                k += 1
            if limited_by == SLO_MISSED:
                notes.append(f"the limit lies in [{lo:g}, {hi:g}]/s")
    elif first == SLO_MISSED:
        notes.append(f"the SLOs fail already at the lowest rate ({lo:g}/s); lower lo")
    return _result("bisect", slo_set, sorted(points, key=lambda p: p.rate_per_s), best, limited_by, notes)


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
        points.append(_point(rate, evaluate(rate), slo_set, max_error_rate))
    best = None
    limited_by: str | None = RANGE if points else None
    notes = []
    for i, p in enumerate(points):
        if not p.ok:
            limited_by = p.outcome
            later = [q.rate_per_s for q in points[i + 1 :] if q.ok]
            if later:
                notes.append(
                    f"{', '.join(f'{r:g}/s' for r in later)} held again after {p.rate_per_s:g}/s failed; not counted"
                )
            break
        best = p.rate_per_s
    return _result("grid", slo_set, points, best, limited_by, notes)


def _point(rate: float, summary: dict[str, Any], slos: Slos, max_error_rate: float) -> SweepPoint:
    outcome, reasons = judge_point(summary, slos, max_error_rate=max_error_rate)
    return SweepPoint(rate, outcome == HOLDS, tuple(reasons), summary, outcome)


def _result(
    method: str,
    slos: Slos,
    points: list[SweepPoint],
    best: float | None,
    limited_by: str | None,
    notes: list[str],
) -> SweepResult:
    """The result, with the notes on what the search could not judge."""
    server = [p.rate_per_s for p in points if p.outcome == SLO_MISSED]
    result = SweepResult(
        method, slos.texts(), points, best, notes, limited_by, min(server) if server else None
    )
    bound = _bound_point(result)
    server_limit = result.server_limit_per_s
    if limited_by in (GENERATOR_LIMITED, INCOMPLETE) and best is not None and server_limit is not None:
        # The answer line says "inconclusive above"; what is known of the server's limit is here.
        notes.append(
            f"the server missed at {server_limit:g}/s: its limit lies in [{best:g}, {server_limit:g}]/s"
        )
    if limited_by == GENERATOR_LIMITED and best is None and bound is not None:
        notes.append(
            f"the generator could not keep up already at the lowest rate ({bound.rate_per_s:g}/s): add workers"
        )
    behind = [p.rate_per_s for p in points if p.outcome == GENERATOR_LIMITED]
    if behind:
        notes.append(
            f"the generator could not keep up at {_rates(behind)}: neither pass nor fail for the server; "
            "add --workers to measure them"
        )
    cut = [p.rate_per_s for p in points if p.outcome == INCOMPLETE]
    if cut:
        notes.append(f"the runs at {_rates(cut)} were incomplete: neither pass nor fail")
    return result


def _rates(rates: list[float]) -> str:
    return ", ".join(f"{r:g}/s" for r in rates)


def _bound_point(result: SweepResult) -> SweepPoint | None:
    """The lowest point above the answer whose outcome bounds it (``limited_by``)."""
    floor = -1.0 if result.max_rate_per_s is None else result.max_rate_per_s
    above = [p for p in result.points if p.rate_per_s > floor and p.outcome == result.limited_by]
    return min(above, key=lambda p: p.rate_per_s) if above else None


def key_figures(summary: dict[str, Any]) -> dict[str, Any]:
    """What a sweep table and plot show of one run's summary."""
    metrics = summary.get("metrics") or {}
    lat = {
        m: {s: (metrics.get(m) or {}).get(s) for s in ("p50", "p90", "p99")}
        for m in metrics_for(SWEEP)
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
        "generator_saturated": (summary.get("generator") or {}).get(
            "saturated", summary.get("generator_saturated")
        ),
        "cost_per_hour_usd": cost.get("cost_per_hour_usd"),
        "output_tokens_per_usd": cost.get("output_tokens_per_usd"),
        "goodput_tokens_per_usd": cost.get("goodput_tokens_per_usd"),
    }


HOLDS_WORDS = {HOLDS: "yes", SLO_MISSED: "no", GENERATOR_LIMITED: "generator", INCOMPLETE: "incomplete"}


def format_sweep(result: SweepResult) -> str:
    """A terminal table of the points and the answer."""
    head = f"{'rate/s':>9}  {'holds':<10}  {'ttft p99':>9}  {'itl p99':>8}  {'tpot p99':>8}  {'out tok/s':>10}  {'goodput/s':>9}  why not"
    lines = [f"sweep ({result.method}) for {', '.join(result.slos)}", head]
    for p in result.points:
        f = key_figures(p.summary)
        lat = f["latency_ms"]
        lines.append(
            f"{p.rate_per_s:>9.3g}  {HOLDS_WORDS[p.outcome]:<10}  {fmt_ms(lat.get('ttft', {}).get('p99')):>9}  "
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
    """``max rate holding the SLOs: 8/s; there goodput 7.9 requests/s (1,010 tokens/s), 252,000 output tokens/$``;
    when the generator (or an incomplete run) bounds the answer, ``max rate holding the SLOs: at least
    8/s; inconclusive above 8/s: the generator was the limit (add workers); at 8/s goodput ...``."""
    best = point_at(result, result.max_rate_per_s)
    bound = _bound_point(result)
    head = "max rate holding the SLOs"
    if best is None:
        if result.limited_by == GENERATOR_LIMITED and bound is not None:
            return f"{head}: none measured: the generator could not keep up at {bound.rate_per_s:g}/s (add workers)"
        if result.limited_by == INCOMPLETE and bound is not None:
            return f"{head}: none judged: the run at {bound.rate_per_s:g}/s was incomplete (neither pass nor fail)"
        return f"{head}: none: the SLOs fail at every rate tried"
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
    r = f"{best.rate_per_s:g}/s"
    if result.limited_by == GENERATOR_LIMITED:
        return f"{head}: at least {r}; inconclusive above {r}: the generator was the limit (add workers); at {r} {good}, {cost}"
    if result.limited_by == INCOMPLETE and bound is not None:
        return (f"{head}: at least {r}; inconclusive above {r}: the run at {bound.rate_per_s:g}/s was incomplete "
                f"(neither pass nor fail); at {r} {good}, {cost}")  # fmt: skip
    return f"{head}: {r}; there {good}, {cost}"


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:,.1f}"


def _percentile_slos(slos: str | Iterable[str] | Slos) -> Slos:
    s = parse_slos(slos)
    if not s.percentile:
        raise ValueError("a sweep needs at least one percentile SLO, e.g. ttft_p99=500ms,itl_p99=50ms")
    return s


__all__ = [
    "GENERATOR_LIMITED",
    "HOLDS",
    "HOLDS_WORDS",
    "INCOMPLETE",
    "OUTCOMES",
    "SLO_MISSED",
    "SweepPoint",
    "SweepResult",
    "check_point",
    "describe_max",
    "find_max_rate",
    "format_sweep",
    "grid",
    "judge_point",
    "key_figures",
    "point_at",
]
