"""The verdict a run is heading for, from what the master has merged so far.

The final verdict (``loadgen.runtime.verdict``) is decided from the results on disk once the run
ends; this is the same rule applied to the live histograms, in the same order, so the web UI can
say while the run goes which way it is going: the generator saturated (its schedule lag p99 or
the share of coalesced reads over their bounds), then percentile SLOs missed, then failed
requests, else passing. What only the end can tell (sessions that never started, requests cut at
the stop) is not judged here. Values are over everything merged so far, warm-up included; the
final verdict counts the measurement window only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from analysis.generator_health import COALESCED_BOUND, coalescing_from_histograms
from analysis.hdr import percentile_values
from analysis.slo import PercentileSlo, parse_slos
from analysis.units import format_duration_us

# The states, named as the final verdict's exit codes are (docs/exit-codes.md).
PASSING = "passing"
FAILED_REQUESTS = "failed requests"  # exit 1 at the end
SLO_MISSED = "SLO missed"  # exit 3
GENERATOR_SATURATED = "generator saturated"  # exit 4
WAITING = "waiting"  # nothing merged yet
STATE_EXIT_CODES = {PASSING: 0, FAILED_REQUESTS: 1, SLO_MISSED: 3, GENERATOR_SATURATED: 4}


@dataclass(frozen=True, slots=True)
class SloCheck:
    """One percentile SLO against the live histogram: observed in µs (None: no values yet)."""

    slo: PercentileSlo
    observed_us: float | None

    @property
    def ok(self) -> bool:
        return self.observed_us is not None and self.observed_us <= self.slo.limit_us

    def text(self) -> str:
        seen = "no values yet" if self.observed_us is None else format_duration_us(self.observed_us)
        return f"{seen} ({'passing' if self.ok else 'failing'})"


@dataclass(frozen=True, slots=True)
class GeneratorHealth:
    schedule_lag_p99_us: float | None
    bound_us: float
    coalesced_share: float | None

    @property
    def saturated(self) -> bool:
        lag = self.schedule_lag_p99_us is not None and self.schedule_lag_p99_us > self.bound_us
        return lag or (self.coalesced_share is not None and self.coalesced_share > COALESCED_BOUND)

    def text(self) -> str:
        lag = "-" if self.schedule_lag_p99_us is None else format_duration_us(self.schedule_lag_p99_us)
        parts = [f"schedule lag p99 {lag} (bound {format_duration_us(self.bound_us)})"]
        if self.coalesced_share is not None:
            parts.append(f"coalesced reads {100.0 * self.coalesced_share:.1f}% (bound {100.0 * COALESCED_BOUND:g}%)")
        return ("saturated: " if self.saturated else "healthy: ") + ", ".join(parts)


@dataclass(frozen=True, slots=True)
class VerdictSoFar:
    state: str
    text: str
    slos: tuple[SloCheck, ...]
    generator: GeneratorHealth

    @property
    def exit_code(self) -> int | None:
        """The exit code the run would end with if it ended now (None before any request)."""
        return STATE_EXIT_CODES.get(self.state)


def slo_checks(aggregate: Any, slos: Any) -> tuple[SloCheck, ...]:
    """Each percentile SLO of ``slos`` (``--slo`` texts) against ``aggregate``'s merged histograms."""
    out = []
    for slo in parse_slos(slos or None).percentile:
        h = aggregate.combined(slo.metric)
        if not h.get_total_count():
            out.append(SloCheck(slo, None))
            continue
        if slo.percentile is None:
            observed = float(h.get_mean_value())
        else:
            observed = float(percentile_values(h, (slo.percentile,))[0])
        out.append(SloCheck(slo, observed))
    return tuple(out)


def generator_health(aggregate: Any, bound_us: float, coalescing: tuple[int, int] | None = None) -> GeneratorHealth:
    """Schedule lag p99 against its bound, and the share of coalesced reads: from the workers'
    own counts when given (``coalescing``, what the final verdict reads), else estimated from the
    histograms (ITL gaps of 0 µs over token chunks)."""
    lag = aggregate.combined("schedule_lag")
    p99 = float(percentile_values(lag, (99.0,))[0]) if lag.get_total_count() else None
    if coalescing is not None and coalescing[1]:
        coalesced, chunks = coalescing
    else:
        coalesced, chunks = coalescing_from_histograms(getattr(aggregate, "cumulative", None) or {})
    return GeneratorHealth(p99, bound_us, coalesced / chunks if chunks else None)


def verdict_so_far(
    aggregate: Any, slos: Any, max_schedule_lag_us: float, coalescing: tuple[int, int] | None = None
) -> VerdictSoFar:
    """The final verdict's rule on the live numbers (module docstring)."""
    checks = slo_checks(aggregate, slos)
    gen = generator_health(aggregate, max_schedule_lag_us, coalescing)
    errors = sum(aggregate.errors.values())
    done = aggregate.requests
    if not done and not errors:
        return VerdictSoFar(WAITING, "no request has finished yet", checks, gen)
    if gen.saturated:
        return VerdictSoFar(GENERATOR_SATURATED, f"generator saturated so far: {gen.text().partition(': ')[2]}", checks, gen)
    missed = [f"{c.slo} (observed {c.text().rpartition(' (')[0]})" for c in checks if not c.ok]
    if missed:
        return VerdictSoFar(SLO_MISSED, "SLO missed so far: " + "; ".join(missed), checks, gen)
    if errors:
        by = ", ".join(f"{k} {v:,}" for k, v in sorted(aggregate.errors.items()))
        return VerdictSoFar(FAILED_REQUESTS, f"{errors:,} of {done:,} requests failed so far ({by})", checks, gen)
    return VerdictSoFar(PASSING, f"passing so far: {done:,} requests, no failures", checks, gen)


__all__ = [
    "FAILED_REQUESTS", "GENERATOR_SATURATED", "PASSING", "SLO_MISSED", "STATE_EXIT_CODES", "WAITING",
    "GeneratorHealth", "SloCheck", "VerdictSoFar", "generator_health", "slo_checks", "verdict_so_far",
]  # fmt: skip
