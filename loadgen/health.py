"""The generator's own health: is this worker too busy to time tokens? (DESIGN §9, saturation)

Two signals a worker measures about itself, besides the schedule lag every request records:

* **event-loop lag**: a greenlet asks to sleep ``period_s`` and records how much later than asked
  it woke. Every greenlet of the worker (streams, arrivals, reports) waits in the same loop, so
  this is how late any of them gets to run. A free loop wakes within ~0.1 ms.
* **receive delay**: per ``recv``, the time from the kernel's receive timestamp of the data to the
  moment the client started parsing it (``loadgen.client``). Token times are the kernel's stamps,
  so they stay exact while the worker falls behind, up to a point: once a stream's next chunk
  arrives before the previous one was read, both come out of one ``recv`` with one stamp, and the
  gap between them is lost. A receive delay near a stream's inter-token gap is that point; the
  delay grows long before ITL errors do, which is why it is watched.

Both go into HDR histograms (µs); a worker ships them encoded with its state, cumulative since its
plan started (refreshed every few seconds, and in its final report); the master merges them
exactly into run.json's ``generator`` section (``summarize``), and the summary flags the run
saturated when a p99 is over its bound (``--max-schedule-lag``; for the receive delay, the run's
ITL p50 when that is longer), as for schedule lag (analysis/summary.py; loadgen/verdict.py: exit 4).

``LOADGEN_TEST_BURN=<busy ms>/<period ms>`` makes the worker burn CPU in a greenlet (busy for the
first number of milliseconds of every period) so that tests can drive it past saturation on
purpose. It is for tests and is named in run.json when set.
"""

from __future__ import annotations

import os
import time
from typing import Any

import gevent
import numpy as np
from hdrh.histogram import HdrHistogram

from analysis.hlog import new_histogram, record_clamped

__all__ = ["BURN_ENV", "GeneratorHealth", "summarize"]

BURN_ENV = "LOADGEN_TEST_BURN"
# Receive delays are folded into their histogram in slices of this many (each fold well under 1 ms),
# and the encoded state is refreshed at most this often in periodic reports.
FOLD_VALUES = 4096
SHIP_INTERVAL_S = 5.0
_perf_ns = time.perf_counter_ns


class GeneratorHealth:
    """One worker's event-loop lag and receive delays since ``start``.

    ``recv_delays_ns`` is the list the streaming client appends to (one value per ``recv`` that
    carried stream lines); ``state()`` folds it into the histogram and returns both, encoded.
    """

    def __init__(self, period_s: float = 0.02) -> None:
        self.period_s = period_s
        self.loop_lag = new_histogram()
        self.recv_delay = new_histogram()
        self.recv_delays_ns: list[int] = []
        self.burn = os.environ.get(BURN_ENV) or None
        self._greenlets: list[gevent.Greenlet] = []
        self._shipped: dict[str, Any] | None = None
        self._shipped_at = 0.0

    def start(self) -> None:
        self._greenlets.append(gevent.spawn(self._watch_loop))
        if self.burn:
            busy_ms, _, period_ms = self.burn.partition("/")
            self._greenlets.append(gevent.spawn(_burn, float(busy_ms) / 1e3, float(period_ms or busy_ms) / 1e3))

    def stop(self) -> None:
        gevent.killall(self._greenlets, block=False)
        self._greenlets = []

    def _watch_loop(self) -> None:
        period_ns = int(self.period_s * 1e9)
        record = self.loop_lag.record_value
        while True:
            t = _perf_ns()
            gevent.sleep(self.period_s)
            record(max(1, (_perf_ns() - t - period_ns) // 1000))
            if len(self.recv_delays_ns) >= FOLD_VALUES:
                self._fold()

    def _fold(self) -> None:
        pending = np.asarray(self.recv_delays_ns, dtype=np.int64)
        self.recv_delays_ns.clear()  # in place: every stream's client holds this very list
        if pending.size:
            record_clamped(self.recv_delay, pending // 1000)

    def state(self, max_age_s: float = SHIP_INTERVAL_S) -> dict[str, Any]:
        """Both histograms so far, encoded (what a worker ships with its state).

        Encoding compresses the whole counts array: several ms for a wide histogram, a pause of
        the event loop that would show in the very lag it measures. So a state younger than
        ``max_age_s`` is shipped again as it was; a final report asks for ``max_age_s=0``.
        """
        now = time.monotonic()
        if self._shipped is not None and now - self._shipped_at < max_age_s:
            return self._shipped
        self._fold()
        out: dict[str, Any] = {"loop_lag": self.loop_lag.encode(), "recv_delay": self.recv_delay.encode()}
        if self.burn:
            out["test_burn"] = self.burn
        self._shipped, self._shipped_at = out, now
        return out


def _burn(busy_s: float, period_s: float) -> None:
    """Hold the loop busy for ``busy_s`` of every ``period_s`` (the test hook)."""
    while True:
        end = time.perf_counter() + busy_s
        while time.perf_counter() < end:
            pass
        gevent.sleep(max(0.0, period_s - busy_s))


def summarize(states: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """run.json's health figures: the workers' histograms merged exactly, as p50/p99/max in ms."""
    merged: dict[str, HdrHistogram] = {"loop_lag": new_histogram(), "recv_delay": new_histogram()}
    burn = None
    for st in states.values():
        health = st.get("health") or {}
        for name, h in merged.items():
            if health.get(name):
                h.decode_and_add(health[name])
        burn = burn or health.get("test_burn")
    out: dict[str, Any] = {f"{name}_ms": _figures(h) for name, h in merged.items()}
    if burn:
        out["test_burn"] = burn
    return out


def _figures(h: HdrHistogram) -> dict[str, Any] | None:
    n = h.get_total_count()
    if not n:
        return None
    return {
        "count": n,
        "p50": round(h.get_value_at_percentile(50) / 1000.0, 3),
        "p99": round(h.get_value_at_percentile(99) / 1000.0, 3),
        "max": round(h.get_max_value() / 1000.0, 3),
    }
