"""The run's verdict and exit code, decided after the final reports (docs/exit-codes.md).

Exit codes mean one thing each, and the first that applies wins:

* 5 the run is incomplete or invalid: stopped before its planned end (a signal, the stop button,
  Locust's ``--run-time``, every worker lost, ``--on-worker-loss abort``, results that could not be
  written), planned sessions never started, a worker lost with work undone (sessions in flight
  whose records never arrived), requests cut at the stop (still on the wire when the drain's
  deadline passed), nothing measured, or every reply empty. None of these runs' figures describe
  the run that was asked for, so no other verdict is given for them.
* 4 the generator could not keep its schedule or its token timing (loadgen/engine/health.py): every
  other figure is then untrustworthy.
* 3 a percentile SLO was missed.
* 1 request failures.
* 0 pass.

2 is a usage error, decided before any load (loadgen/errors.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from analysis.records import CUT_AT_STOP
from analysis.units import format_duration_us

log = logging.getLogger("loadgen")

EXIT_OK = 0
EXIT_REQUEST_FAILURES = 1
EXIT_USAGE = 2
EXIT_SLO_MISSED = 3
EXIT_GENERATOR_SATURATED = 4
EXIT_INCOMPLETE = 5
EXIT_CODES = (EXIT_OK, EXIT_REQUEST_FAILURES, EXIT_USAGE, EXIT_SLO_MISSED, EXIT_GENERATOR_SATURATED, EXIT_INCOMPLETE)


@dataclass
class Verdict:
    exit_code: int
    reason: str

    @property
    def line(self) -> str:
        word = "PASS" if self.exit_code == EXIT_OK else f"FAIL (exit {self.exit_code})"
        return f"loadgen verdict: {word}: {self.reason}"


def verdict_from_summary(summary: dict[str, Any], slos: list[str], run_info: dict[str, Any] | None = None) -> Verdict:
    """Pure decision from a summary.json dict (and run.json's); see the module docstring."""
    info = run_info or {}
    incomplete = incomplete_reasons(summary, info)
    if incomplete:
        return Verdict(EXIT_INCOMPLETE, "run incomplete: " + "; ".join(incomplete))
    verdict = _verdict(summary, slos)
    lost = info.get("lost_workers") or []
    replanned = [w for w in lost if _still_lost(w)]
    if replanned:
        verdict.reason += f"; {_lost_text(replanned)} with nothing in flight, its later arrivals sent by the others"
    back = [w for w in lost if not _still_lost(w)]
    if back:
        verdict.reason += f"; {_lost_text(back)} and back, whose late reports were merged"
    return verdict


def _still_lost(worker: dict[str, Any]) -> bool:
    """Lost and not back, or back and then lost again (run.json ``lost_workers[]``)."""
    return "returned_at_s" not in worker or "lost_again_at_s" in worker


def _left_cleanly(worker: dict[str, Any]) -> bool:
    """It sent everything before it went, the last time it went (a clean first leave says nothing
    of a second loss)."""
    if "lost_again_at_s" in worker:
        return bool(worker.get("left_cleanly_again"))
    return bool(worker.get("left_cleanly"))


def _in_flight_at_loss(worker: dict[str, Any]) -> list[Any]:
    """The sessions it had in flight when it was lost for the last time."""
    if "lost_again_at_s" in worker:
        return list(worker.get("in_flight_sessions_again") or [])
    return list(worker.get("in_flight_sessions") or [])


def incomplete_reasons(summary: dict[str, Any], info: dict[str, Any]) -> list[str]:
    """Why the run is not the run that was asked for, one phrase each; [] when it is whole."""
    reasons: list[str] = []
    if info.get("status") == "aborted":
        reasons.append(str(info.get("abort_reason") or "stopped before its planned end"))
    gone = [w for w in info.get("lost_workers") or [] if _still_lost(w) and not _left_cleanly(w)]
    undone = [w for w in gone if _in_flight_at_loss(w)]
    if undone:
        sessions = sum(len(_in_flight_at_loss(w)) for w in undone)
        reasons.append(
            f"{_lost_text(undone)} with {sessions} session{'s' if sessions != 1 else ''} in flight, "
            "whose unreported requests are missing"
        )
    unreadable = [u for u in info.get("unreadable_reports") or [] if isinstance(u, dict)]
    if unreadable:
        records = sum(int(u.get("records") or 0) for u in unreadable)
        who = ", ".join(str(u.get("worker")) for u in unreadable)
        reasons.append(f"{records} record{'s' if records != 1 else ''} in reports the master could not read (from {who})")
    acc = info.get("accounting") or {}
    not_started = acc.get("sessions_not_started") or {}
    total_not_started = sum(not_started.values())
    if total_not_started:
        detail = ", ".join(f"{n} {why}" for why, n in not_started.items() if n)
        reasons.append(f"{total_not_started} of {acc.get('arrivals_planned')} planned sessions never started ({detail})")
    errors = summary.get("errors") or {}
    cut = errors.get("cut_at_stop") or (errors.get("by_category") or {}).get(CUT_AT_STOP) or 0
    cut = max(cut, (acc.get("outcomes") or {}).get(CUT_AT_STOP, 0))
    if cut:
        stop_s = (info.get("config") or {}).get("stop_timeout_s")
        after = f" (--stop-timeout {stop_s:g}s)" if isinstance(stop_s, int | float) else ""
        reasons.append(
            f"{cut} request{'s were' if cut != 1 else ' was'} still on the wire when the stop's drain deadline "
            f"passed{after}, recorded as cut_at_stop"
        )
    requests = summary.get("requests") or {}
    measured = requests.get("measured", 0)
    by = errors.get("by_category") or {}
    if not measured and not reasons:
        reasons.append("nothing was measured (no request was sent, or none after the warm-up)")
    elif measured and not requests.get("ok") and by and set(by) == {"empty_reply"}:
        reasons.append(f"every reply was empty ({measured} requests, 0 generated tokens)")
    return reasons


def _lost_text(lost: list[dict[str, Any]]) -> str:
    return f"{len(lost)} worker{'s' if len(lost) != 1 else ''} lost (slot {_slots(lost)})"


def _slots(lost: list[dict[str, Any]]) -> str:
    return ", ".join(str(w.get("slot")) for w in lost)


def _verdict(summary: dict[str, Any], slos: list[str]) -> Verdict:
    from analysis.slo import evaluate_percentile_slos

    gen = summary.get("generator") or {}
    if gen.get("saturated"):
        from analysis.generator_health import ADD_WORKERS, signals_text

        # The signals over their bounds, then the measured cause with its advice: the generator's
        # own CPU (add workers), the machine's CPU taken by others (free it), coalesced reads.
        return Verdict(
            EXIT_GENERATOR_SATURATED,
            f"generator saturated: {signals_text(gen)}; {gen.get('cause_detail') or ADD_WORKERS}",
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
        if by.get("client_network"):
            detail += "; client_network is the generator's own network, not the server"
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
        return Verdict(EXIT_INCOMPLETE, f"run invalid: could not summarise {run_dir}: {e}")
    print(format_summary(summary), flush=True)
    print(f"results: {run_dir}", flush=True)
    try:
        run_info = orjson.loads((Path(run_dir) / "run.json").read_bytes())
    except (OSError, orjson.JSONDecodeError):
        run_info = None
    return verdict_from_summary(summary, config.slos, run_info)
