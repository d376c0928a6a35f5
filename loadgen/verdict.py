"""The run's verdict and exit code, decided after the final reports (DESIGN §5).

Exit codes (headless): 0 pass; 1 request failures (Locust's convention); 3 a percentile SLO was
missed; 4 the generator itself was saturated (schedule-lag p99 over ``--max-schedule-lag``), which
makes every other number untrustworthy, so it wins; 2 is a usage error, decided earlier.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analysis.units import format_duration_us

log = logging.getLogger("loadgen")

EXIT_OK = 0
EXIT_REQUEST_FAILURES = 1
EXIT_USAGE = 2
EXIT_SLO_MISSED = 3
EXIT_GENERATOR_SATURATED = 4


@dataclass
class Verdict:
    exit_code: int
    reason: str

    @property
    def line(self) -> str:
        word = "PASS" if self.exit_code == EXIT_OK else f"FAIL (exit {self.exit_code})"
        return f"loadgen verdict: {word}: {self.reason}"


def verdict_from_summary(summary: dict[str, Any], slos: list[str], max_schedule_lag_us: int) -> Verdict:
    """Pure decision from a summary.json dict; see the module docstring for the order."""
    from analysis.slo import evaluate_percentile_slos, parse_slos

    lag_p99 = (summary.get("metrics", {}).get("schedule_lag") or {}).get("p99")
    if lag_p99 is not None and lag_p99 > max_schedule_lag_us:
        return Verdict(
            EXIT_GENERATOR_SATURATED,
            f"generator saturated: schedule-lag p99 {format_duration_us(lag_p99)} > "
            f"{format_duration_us(max_schedule_lag_us)}; add workers (--workers N) or lower the rate",
        )
    checks = evaluate_percentile_slos(summary, parse_slos(",".join(slos))) if slos else []
    missed = [c for c in checks if not c.ok]
    if missed:
        return Verdict(EXIT_SLO_MISSED, "SLO missed: " + "; ".join(c.describe() for c in missed))
    errors = summary.get("errors", {}).get("total", 0)
    requests = summary.get("requests", {}).get("total", 0)
    if errors:
        return Verdict(EXIT_REQUEST_FAILURES, f"{errors} of {requests} requests failed")
    met = "; ".join(c.describe() for c in checks)
    return Verdict(EXIT_OK, f"{requests} requests, no failures" + (f"; SLOs met: {met}" if met else ""))


def decide_verdict(run_dir: Path, config: Any, environment: Any) -> Verdict:
    """Summarise the finished run (writes summary.json), print the table, and decide."""
    from analysis.summary import format_summary, write_summary

    try:
        summary = write_summary(run_dir, slos=",".join(config.slos) or None)
    except Exception as e:  # the data is on disk; a report bug must not hide it
        log.exception("summary failed")
        return Verdict(EXIT_USAGE, f"could not summarise {run_dir}: {e}")
    print(format_summary(summary), flush=True)
    print(f"results: {run_dir}", flush=True)
    return verdict_from_summary(summary, config.slos, config.max_schedule_lag_us)
