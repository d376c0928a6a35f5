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


def _offset() -> float:
    try:
        return float(os.environ.get(OFFSET_ENV, "") or 0.0)
    except ValueError:
        return 0.0


_OFFSET_S = _offset()


def worker_wall_time() -> float:
    """``time.time()`` on this worker's clock (shifted by ``$LOADGEN_WORKER_CLOCK_OFFSET_S``)."""
    return time.time() + _OFFSET_S
