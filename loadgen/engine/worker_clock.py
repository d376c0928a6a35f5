"""The worker's wall clock: every wall-clock read on the worker side goes through here.

``LOADGEN_WORKER_CLOCK_OFFSET_S`` (seconds, may be negative) shifts it: a test aid that
simulates a worker host whose clock is off by that much (docs/distributed.md). The master
measures the offset in the READY/GO handshake and anchors the worker's run start for it.
"""

from __future__ import annotations

import os
import time

OFFSET_ENV = "LOADGEN_WORKER_CLOCK_OFFSET_S"

# The master measures a worker's clock with pings (after its READY at the start, at its join
# mid-run) until one comes back within this error bound, or CLOCK_PINGS have: a worker busy loading
# its plan or with Locust's start message answers late, and a late answer is an inexact one (seen:
# +335.8 +/- 36.3 ms for a +300 ms skew from READY alone on a busy machine). The best (least
# error) sample anchors it. The start waits at most CLOCK_REFINE_WAIT_S for the pings.
CLOCK_GOOD_ERROR_S = 0.002
CLOCK_PINGS = 8
CLOCK_REFINE_WAIT_S = 0.5

# A worker whose clock is off the master's by more than --max-clock-offset (beyond the
# measurement's own error) is refused before load, unless --allow-clock-offset: its arrivals are
# anchored for the offset either way, but logs, traces and every other tool on that host see the
# wrong time, and an offset that large is a clock not synced (a synced cloud host is well under
# 1 ms). During the run the master measures again every CLOCK_RECHECK_S; a clock that drifted
# from its anchor by more than the bound is named in run.json's warnings.
DEFAULT_MAX_CLOCK_OFFSET_S = 0.005
CLOCK_RECHECK_S = 5.0
CLOCK_RECHECK_PINGS = 3


MAX_CLOCK_OFFSET_DEFAULT = f"{DEFAULT_MAX_CLOCK_OFFSET_S * 1000:g}ms"
MAX_CLOCK_OFFSET_HELP = (
    "Refuse, before load, a worker whose clock is off the master's by more than this (measured, "
    "beyond the measurement's error); its arrivals are corrected either way"
)
ALLOW_CLOCK_OFFSET_HELP = "Accept workers whose clock is off by more than --max-clock-offset (recorded in run.json)"


def parse_max_clock_offset(value: str) -> float:
    """``--max-clock-offset`` in seconds; UserError-free: a ValueError names what is wrong."""
    from analysis.units import parse_duration_s

    bound_s = parse_duration_s(value)
    if bound_s <= 0:
        raise ValueError(f"{value!r} must be more than 0, e.g. 5ms")
    return bound_s


def clock_offset_refusal(worker: str, offset_s: float, error_s: float, bound_s: float) -> str | None:
    """The one-line refusal of a worker whose clock is surely off by more than ``bound_s`` (its
    offset less the measurement's error), else None."""
    if abs(offset_s) - error_s <= bound_s:
        return None
    return (
        f"worker {worker}'s clock is {offset_s * 1000:+.1f} ms (+/- {error_s * 1000:.1f} ms) off the master's, "
        f"over --max-clock-offset {bound_s * 1000:g}ms: sync its clock (chrony, NTP) or pass --allow-clock-offset"
    )


def _offset() -> float:
    try:
        return float(os.environ.get(OFFSET_ENV, "") or 0.0)
    except ValueError:
        return 0.0


_OFFSET_S = _offset()


def worker_wall_time() -> float:
    """``time.time()`` on this worker's clock (shifted by ``$LOADGEN_WORKER_CLOCK_OFFSET_S``)."""
    return time.time() + _OFFSET_S
