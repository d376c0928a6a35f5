"""The run's verdict and exit code, decided after the final reports (DESIGN §5).

Exit codes (headless): 0 pass; 1 request failures (Locust's convention); 3 a percentile SLO was
missed; 4 the generator itself failed: it was saturated (schedule-lag, event-loop-lag or
receive-delay p99 over ``--max-schedule-lag``; loadgen/health.py), which makes every other
number untrustworthy, so it wins, or it lost a worker under ``--on-worker-loss abort``, or lost
every worker; 2 is a usage error, decided earlier.

A worker lost under ``--on-worker-loss continue`` does not change the code (the user chose to go
on without it), but the verdict line names the lost slots, since their last requests are missing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

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


def verdict_from_summary(summary: dict[str, Any], slos: list[str], run_info: dict[str, Any] | None = None) -> Verdict:
    """Pure decision from a summary.json dict (and run.json's, for lost workers); see the module docstring."""
    info = run_info or {}
    lost = info.get("lost_workers") or []
    # A lost worker that reported again and kept its slot had its late reports merged.
    gone = [w for w in lost if "returned_at_s" not in w]
    back = [w for w in lost if "returned_at_s" in w]
    slot_holders = {w.get("id") for w in info.get("workers") or []}
    if gone and slot_holders and slot_holders <= {w.get("worker") for w in gone}:
        return Verdict(
            EXIT_GENERATOR_SATURATED,
            f"generator failed: every worker was lost (slot {_slots(lost)}); the figures cover only part of the run",
        )
    if lost and (info.get("config") or {}).get("on_worker_loss") == "abort":
        return Verdict(
            EXIT_GENERATOR_SATURATED,
            f"generator failed: {_lost_text(lost)} and --on-worker-loss abort stopped the run; "
            "its figures cover only part of the run",
        )
    verdict = _verdict(summary, slos)
    if gone:
        verdict.reason += f"; {_lost_text(gone)}, whose unreported requests are missing"
    if back:
        verdict.reason += f"; {_lost_text(back)} and back, whose late reports were merged"
    return verdict


def _lost_text(lost: list[dict[str, Any]]) -> str:
    return f"{len(lost)} worker{'s' if len(lost) != 1 else ''} lost (slot {_slots(lost)})"


def _slots(lost: list[dict[str, Any]]) -> str:
    return ", ".join(str(w.get("slot")) for w in lost)


def _verdict(summary: dict[str, Any], slos: list[str]) -> Verdict:
    from analysis.slo import evaluate_percentile_slos

    gen = summary.get("generator") or {}
    if gen.get("saturated"):
        signals = ", ".join(gen.get("saturated_by") or []) or f"schedule-lag p99 {gen.get('schedule_lag_p99_ms')} ms"
        # The measured cause and its advice (analysis/generator_health.py): the generator's own
        # CPU (add workers), the machine's CPU taken by others (free it), coalesced reads.
        cause = gen.get("cause_detail") or "add workers (--workers N) or lower the rate"
        return Verdict(
            EXIT_GENERATOR_SATURATED, f"generator saturated: {signals} > {gen.get('saturation_bound_ms')} ms; {cause}"
        )
    checks = evaluate_percentile_slos(summary, slos) if slos else []
    missed = [f"{slo} (observed {_ms(obs)})" for slo, obs, ok in checks if not ok]
    if missed:
        return Verdict(EXIT_SLO_MISSED, "SLO missed: " + "; ".join(missed))
    requests = summary.get("requests") or {}
    errors = requests.get("errors", 0)
    measured = requests.get("measured", 0)
    if errors:
        by = (summary.get("errors") or {}).get("by_category") or {}
        detail = ", ".join(f"{k} {v}" for k, v in by.items())
        return Verdict(EXIT_REQUEST_FAILURES, f"{errors} of {measured} requests failed ({detail})")
    met = "; ".join(f"{slo} (observed {_ms(obs)})" for slo, obs, _ in checks)
    return Verdict(EXIT_OK, f"{measured} requests, no failures" + (f"; SLOs met: {met}" if met else ""))


def _ms(value_ms: float | None) -> str:
    return "none" if value_ms is None else format_duration_us(value_ms * 1000.0)


def decide_verdict(run_dir: Path, config: Any, environment: Any) -> Verdict:
    """Summarise the finished run (writes summary.json), print the table, and decide."""
    from analysis.summary import format_summary, write_summary

    try:
        summary = orjson.loads(write_summary(run_dir).read_bytes())
    except Exception as e:  # the data is on disk; a report bug must not hide it
        log.exception("summary failed")
        return Verdict(EXIT_USAGE, f"could not summarise {run_dir}: {e}")
    print(format_summary(summary), flush=True)
    print(f"results: {run_dir}", flush=True)
    try:
        run_info = orjson.loads((Path(run_dir) / "run.json").read_bytes())
    except (OSError, orjson.JSONDecodeError):
        run_info = None
    return verdict_from_summary(summary, config.slos, run_info)
