"""A worker's garbage collection, at the moments no token is waiting to be read.

CPython collects its youngest generation after 700 net allocations of tracked objects, but
objects reused from the free lists (tuples, lists, dicts) join that generation uncounted, so at
hundreds of sessions a second a "young" collection met 5,000-23,000 objects and paused the worker
for 1-7 ms, ~9 times a second, wherever the count happened to run out: in a session's bookkeeping,
in a report, in the middle of the stream reader's round. A chunk that waits past the stream's next
one comes out of the same read: both get one stamp and their gap is lost (at 500 streams with
tokens 10 ms apart, 0.3-1.2% of the chunks, and an ITL error p99 of a whole interval once that
passed ~0.5%: each such pair spoils two gaps).

So while load runs the worker collects by the clock instead: the young generation every
``YOUNG_EVERY_NS`` when the stream reader has just read everything ready and is about to wait
(``at_idle``), the middle one every ``MIDDLE_EVERY`` young collections, all of them every
``FULL_EVERY_S``, and, should the reader never wait (saturated) or not run (no stream), from the
health loop once ``YOUNG_LATE_NS`` have passed. The heap the worker started with is frozen first
(``gc.freeze``): the full collections scan only what the run made. Automatic collection comes back
when the worker's health monitor stops (``GeneratorHealth.stop``: the next run's preparation).
"""

from __future__ import annotations

import gc
import time
from typing import Any

from targets.quiet_gc import quiet_gc

YOUNG_EVERY_NS = 5_000_000
YOUNG_LATE_NS = 50_000_000
MIDDLE_EVERY = 10
FULL_EVERY_S = 60.0

_perf_ns = time.perf_counter_ns


class ClockCollector:
    """The collection schedule above; one per worker process (``COLLECTOR``)."""

    def __init__(self) -> None:
        self.active = False
        self._last_ns = 0
        self._last_full_ns = 0
        self._young = 0
        self.collections = [0, 0, 0]  # by generation, while active
        self.pause_ns_max = 0
        self.pause_ns_total = 0  # the collections' time in all: their share of the worker's CPU

    def start(self) -> None:
        """Freeze the heap as it is and take over from the automatic collector (whose quieter
        thresholds ``quiet_gc`` sets for when it comes back)."""
        if self.active:
            return
        quiet_gc()
        gc.disable()
        self.active = True
        self._last_ns = self._last_full_ns = _perf_ns()

    def stop(self) -> None:
        if not self.active:
            return
        self.active = False
        gc.enable()

    def figures(self) -> dict[str, Any]:
        """What run.json's ``generator.gc`` says of this worker: how its collections ran ("clock":
        this schedule; "automatic": CPython's, before load), how many of each generation under it,
        the longest and their time in all."""
        return {
            "by": "clock" if self.active else "automatic",
            "collections": list(self.collections),
            "pause_max_ms": round(self.pause_ns_max / 1e6, 3),
            "pause_total_ms": round(self.pause_ns_total / 1e6, 3),
        }

    def at_idle(self) -> None:
        """The stream reader has read all that was ready: collect if it is time."""
        if self.active and _perf_ns() - self._last_ns >= YOUNG_EVERY_NS:
            self._collect()

    def if_late(self) -> None:
        """From a periodic loop: collect if the reader has not for ``YOUNG_LATE_NS``."""
        if self.active and _perf_ns() - self._last_ns >= YOUNG_LATE_NS:
            self._collect()

    def _collect(self) -> None:
        t = _perf_ns()
        if t - self._last_full_ns >= FULL_EVERY_S * 1e9:
            generation = 2
            self._last_full_ns = t
        elif self._young + 1 >= MIDDLE_EVERY:
            generation = 1
        else:
            generation = 0
        self._young = 0 if generation else self._young + 1
        gc.collect(generation)
        self._last_ns = now = _perf_ns()
        self.collections[generation] += 1
        self.pause_ns_max = max(self.pause_ns_max, now - t)
        self.pause_ns_total += now - t


COLLECTOR = ClockCollector()


def merge_gc(workers: list[dict[str, Any]]) -> dict[str, Any]:
    """The workers' figures as one: collections and their time summed, the longest pause, "clock"
    when every worker collected by the clock."""
    return {
        "by": "clock" if all(w.get("by") == "clock" for w in workers) else "automatic",
        "collections": [sum((w.get("collections") or [0, 0, 0])[g] for w in workers) for g in range(3)],
        "pause_max_ms": max(float(w.get("pause_max_ms") or 0.0) for w in workers),
        "pause_total_ms": round(sum(float(w.get("pause_total_ms") or 0.0) for w in workers), 3),
    }

__all__ = [
    "COLLECTOR", "FULL_EVERY_S", "MIDDLE_EVERY", "YOUNG_EVERY_NS", "YOUNG_LATE_NS", "ClockCollector", "merge_gc",
]  # fmt: skip
