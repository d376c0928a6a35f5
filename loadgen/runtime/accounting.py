"""The run's accounting: every arrival planned, every session started or not (and why), and one
outcome for every request sent (docs/exit-codes.md).

The master keeps one ``Accounting`` per run. It is planned from the same global schedule every
worker builds (so it knows the run's arrivals before any is sent), counts the outcome of every
record it writes, and is closed at the end with what the workers reported: how many sessions
each started, and which shares of the schedule each was given. What is missing then has a
reason: ``worker lost`` (arrivals a lost worker held that came due before they were re-planned
onto the others) or ``stopped early`` (the run ended before they came due). The verdict
(loadgen/runtime/verdict.py) reads it from ``run.json``: any session not started makes the run
incomplete (exit 5).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from analysis.records import CUT_AT_STOP, RequestRecord
from loadgen.config import RunConfig
from loadgen.engine.driver import Schedule

__all__ = ["Accounting", "Share"]

WORKER_LOST = "worker lost"
STOPPED_EARLY = "stopped early"
UNEXPLAINED = "not sent by any worker"

# A worker taking over a lost slot sends the slot's arrivals from this long after the takeover:
# its plan reaches it first, so none of them is sent late (late ones would count as schedule lag).
TAKEOVER_LEAD_S = 0.5


def handover_s(now_s: float) -> float:
    """When a lost worker's arrivals pass to others: ``TAKEOVER_LEAD_S`` from ``now_s``, on a whole
    millisecond. run.json says it to the millisecond (``arrivals_from_s``), so it must be that
    number exactly: rounded to the nearest one it could name a time after an arrival that was
    sent, or before one that was not."""
    return math.ceil(max(0.0, now_s + TAKEOVER_LEAD_S) * 1000) / 1000


@dataclass
class Share:
    """Part of the schedule a worker was given: slot ``slot``'s arrivals narrowed by ``splits``
    (``loadgen.engine.driver.share_indices``), those due in ``[from_s, until_s)``."""

    slot: int
    splits: list[list[int]] = field(default_factory=list)
    from_s: float = 0.0
    until_s: float = float("inf")


@dataclass
class Accounting:
    """See the module docstring. ``arrivals_planned`` is None for a closed loop bounded by time."""

    arrivals_planned: int | None
    sessions_available: int | None = None
    cut_by: list[str] = field(default_factory=list)
    mode: str = "open-loop"
    outcomes: Counter = field(default_factory=Counter)
    sessions_started: int = 0
    sessions_not_started: dict[str, int] = field(default_factory=dict)
    schedule: Schedule | None = None  # or a loadgen.engine.plan_stream.StreamedSchedule
    n_slots: int = 1

    @classmethod
    def plan(cls, cfg: RunConfig, schedule: Schedule | None, workload: Any) -> Accounting:
        if schedule is None:  # closed loop: as many sessions as the agents get through
            limit = cfg.num_sessions
            # A streamed trace is read only as far as --num-sessions (unbounded otherwise: its agents
            # stop at its end).
            streamed = getattr(workload, "streams_sessions", False)
            held = workload.sessions_available(at_most=limit) if not streamed or limit else None
            if held is not None:
                limit = held if limit is None else min(limit, held)
            return cls(None if cfg.duration_s is not None else limit, held, mode="closed-loop")
        # A streamed schedule of a whole file is counted during the run (planned None until then:
        # loadgen.engine.plan_stream.count_in_background).
        return cls(schedule.planned, schedule.available, list(schedule.cut_by), schedule=schedule)

    def count(self, records: Iterable[RequestRecord]) -> None:
        """One outcome per request sent: ``ok``, or its error category (``cut_at_stop`` included)."""
        for r in records:
            self.outcomes["ok" if r.ok else (r.error_category or "unknown")] += 1

    @property
    def requests_sent(self) -> int:
        return sum(self.outcomes.values())

    def due(self, shares: list[Share]) -> int:
        """How many arrivals of ``shares`` fall in their time ranges."""
        if self.schedule is None:
            return 0
        return self.schedule.due(self.n_slots, shares)

    def close(self, *, started_by_worker: dict[str, int], lost_shares: dict[str, list[Share]], aborted: bool) -> None:
        """Settle the sessions: started (as the workers last reported), and the rest by reason.

        ``lost_shares``: for each worker lost and not back, the shares it held, each cut at the
        time its arrivals went to another worker (or never, when none could take them).
        """
        self.sessions_started = sum(started_by_worker.values())
        self.sessions_not_started = {}
        if self.arrivals_planned is None:
            return
        missing = max(0, self.arrivals_planned - self.sessions_started)
        lost = sum(max(0, self.due(shares) - started_by_worker.get(w, 0)) for w, shares in lost_shares.items())
        lost = min(lost, missing)
        if lost:
            self.sessions_not_started[WORKER_LOST] = lost
        rest = missing - lost
        if rest:
            self.sessions_not_started[STOPPED_EARLY if aborted else UNEXPLAINED] = rest

    def as_dict(self) -> dict[str, Any]:
        failed = {k: v for k, v in sorted(self.outcomes.items()) if k not in ("ok", CUT_AT_STOP)}
        return {
            "mode": self.mode,
            "arrivals_planned": self.arrivals_planned,
            "sessions_available": self.sessions_available,
            "schedule_cut_by": list(self.cut_by),
            "sessions_started": self.sessions_started,
            "sessions_not_started": dict(self.sessions_not_started),
            "requests_sent": self.requests_sent,
            "outcomes": {
                "ok": self.outcomes.get("ok", 0),
                "failed": sum(failed.values()),
                "failed_by_category": failed,
                CUT_AT_STOP: self.outcomes.get(CUT_AT_STOP, 0),
            },
        }

    def line(self) -> str:
        """The accounting in one line, printed just before the verdict."""
        d = self.as_dict()
        out = d["outcomes"]
        planned = "unbounded (closed loop)" if d["arrivals_planned"] is None else str(d["arrivals_planned"])
        parts = [f"{planned} sessions planned"]
        if d["sessions_available"] is not None and self.cut_by:
            parts[0] += f" (of {d['sessions_available']} in the workload; cut by {', '.join(self.cut_by)})"
        not_started = sum(d["sessions_not_started"].values())
        started = f"{d['sessions_started']} started"
        if not_started:
            started += f", {not_started} not started (" + ", ".join(
                f"{n} {why}" for why, n in d["sessions_not_started"].items()
            ) + ")"
        parts.append(started)
        fails = ", ".join(f"{k} {v}" for k, v in out["failed_by_category"].items())
        parts.append(
            f"{d['requests_sent']} requests sent: {out['ok']} ok, {out['failed']} failed"
            + (f" ({fails})" if fails else "")
            + f", {out[CUT_AT_STOP]} cut at stop"
        )
        return "loadgen accounting: " + "; ".join(parts)
