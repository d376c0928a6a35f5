"""How long a master waits for a silent worker, and a worker for its silent master.

Heartbeats go both ways once a second (Locust's ``HEARTBEAT_INTERVAL``): each worker sends one,
and the master answers it. Both sides count heartbeat *intervals*, not wall time, so a process
that was itself paused (SIGSTOP, a VM freeze, a long merge) wakes up to one missed interval, not
to a long silence.

* ``--worker-loss-timeout T`` (master, default 5 s): a worker is lost once no heartbeat came from
  it for T; the master notices within one interval more. It is Locust's own liveness count
  (``HEARTBEAT_LIVENESS``), set from T, so Locust and loadgen call a worker missing together.
* ``--master-loss-timeout M`` (worker, default 15 s): a worker running load stops it and exits
  once no answer came from its master for M (``loadgen.runtime.master_watch``).

M must exceed T by ``LOSS_TIMEOUT_MARGIN_S``: then a partition shorter than T heals with nothing
lost, and in a longer one the master decides first (it re-plans the worker's arrivals onto the
others), so the worker that comes back finds its loss already counted, once.
"""

from __future__ import annotations

import math
from typing import Any

from analysis.units import parse_duration_s
from loadgen.errors import UserError

DEFAULT_WORKER_LOSS_TIMEOUT_S = 5.0
DEFAULT_MASTER_LOSS_TIMEOUT_S = 15.0
WORKER_LOSS_TIMEOUT_HELP = "A worker silent this long (no heartbeat) is lost; its arrivals go to the others."
MASTER_LOSS_TIMEOUT_HELP = (
    "A worker whose master is silent this long stops its load and exits; keep it 3s or more above the "
    "master's --worker-loss-timeout."
)
# Locust's HEARTBEAT_INTERVAL (a unit test checks they agree). Not imported: the CLI reads these
# defaults, and importing Locust costs it ~0.5 s and patches the standard library with gevent.
HEARTBEAT_INTERVAL_S = 1.0
# Below 3 intervals a worker one late heartbeat away from its next one would flap in and out.
MIN_LOSS_TIMEOUT_S = 3 * HEARTBEAT_INTERVAL_S
# Ten minutes: longer is most likely a slip of the unit (a bare 5000 meant as ms), and a worker that
# waits that long sends that much load nobody records.
MAX_LOSS_TIMEOUT_S = 600.0
# The master notices a loss up to one interval after T (plus its 0.25 s poll); a worker counts
# its silence from an answer up to one interval old. Two intervals and the poll, rounded up.
LOSS_TIMEOUT_MARGIN_S = 3 * HEARTBEAT_INTERVAL_S


def parse_loss_timeout(flag: str, value: Any) -> float:
    """Seconds in ``value`` (e.g. ``"5s"``); a one-line UserError naming ``flag`` if out of range."""
    try:
        seconds = parse_duration_s(value)
    except ValueError as e:
        raise UserError(f"{flag}: {e}") from None
    if not MIN_LOSS_TIMEOUT_S <= seconds <= MAX_LOSS_TIMEOUT_S:
        raise UserError(
            f"{flag} {value}: must be between {MIN_LOSS_TIMEOUT_S:g}s and {MAX_LOSS_TIMEOUT_S:g}s "
            f"(heartbeats come once a second); e.g. {flag} 10s"
        )
    return seconds


def check_timeouts_consistent(worker_loss_timeout_s: float, master_loss_timeout_s: float) -> None:
    """A usage error unless a worker waits for its master longer than the master waits for it."""
    if master_loss_timeout_s < worker_loss_timeout_s + LOSS_TIMEOUT_MARGIN_S:
        raise UserError(
            f"--master-loss-timeout {master_loss_timeout_s:g}s must be at least {LOSS_TIMEOUT_MARGIN_S:g}s longer than "
            f"--worker-loss-timeout {worker_loss_timeout_s:g}s, so that the master counts a partitioned worker lost "
            f"before the worker gives up; e.g. --master-loss-timeout {worker_loss_timeout_s + 10:g}s"
        )


def timeouts_warning(worker_loss_timeout_s: float, master_loss_timeout_s: float) -> str | None:
    """The worker's warning when its master's timeout leaves it too little margin (or None)."""
    try:
        check_timeouts_consistent(worker_loss_timeout_s, master_loss_timeout_s)
    except UserError as e:
        return f"this worker's {e.message} (the master's is {worker_loss_timeout_s:g}s)"
    return None


def heartbeat_liveness(worker_loss_timeout_s: float) -> int:
    """Locust's ``HEARTBEAT_LIVENESS`` for a master that loses a worker silent for the timeout.

    Locust resets a worker's count to the liveness on each heartbeat, takes one off per interval,
    and marks the worker missing at the check that finds it below zero: liveness + 2 checks
    later, i.e. after (liveness + 1) to (liveness + 2) silent intervals. So liveness + 1
    intervals must cover the timeout.
    """
    return max(0, math.ceil(worker_loss_timeout_s / HEARTBEAT_INTERVAL_S - 1e-9) - 1)


def missed_checks(master_loss_timeout_s: float) -> int:
    """Silent checks (one an interval) after which a worker counts its master lost."""
    return max(1, math.ceil(master_loss_timeout_s / HEARTBEAT_INTERVAL_S - 1e-9))


def apply_to_master(worker_loss_timeout_s: float) -> None:
    """Set Locust's liveness count on the master (read by Locust on every heartbeat)."""
    import locust.runners

    locust.runners.HEARTBEAT_LIVENESS = heartbeat_liveness(worker_loss_timeout_s)


def apply_to_worker(master_loss_timeout_s: float) -> None:
    """Keep Locust's own idle-worker limit (60 s without a master) beyond the worker's timeout."""
    import locust.runners

    locust.runners.MASTER_HEARTBEAT_TIMEOUT = max(60, math.ceil(master_loss_timeout_s) + 5)


__all__ = [
    "DEFAULT_MASTER_LOSS_TIMEOUT_S",
    "DEFAULT_WORKER_LOSS_TIMEOUT_S",
    "LOSS_TIMEOUT_MARGIN_S",
    "apply_to_master",
    "apply_to_worker",
    "check_timeouts_consistent",
    "heartbeat_liveness",
    "missed_checks",
    "parse_loss_timeout",
    "timeouts_warning",
]
