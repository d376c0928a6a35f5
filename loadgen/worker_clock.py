"""The worker's wall clock: every wall-clock read on the worker side goes through here.

``LOADGEN_WORKER_CLOCK_OFFSET_S`` (seconds, may be negative) shifts it: a test aid that
simulates a worker host whose clock is off by that much (docs/distributed.md). The master
measures the offset in the READY/GO handshake and anchors the worker's run start for it.
"""

from __future__ import annotations

import os
import time

OFFSET_ENV = "LOADGEN_WORKER_CLOCK_OFFSET_S"


def _offset() -> float:
    try:
        return float(os.environ.get(OFFSET_ENV, "") or 0.0)
    except ValueError:
        return 0.0


_OFFSET_S = _offset()


def worker_wall_time() -> float:
    """``time.time()`` on this worker's clock (shifted by ``$LOADGEN_WORKER_CLOCK_OFFSET_S``)."""
    return time.time() + _OFFSET_S
