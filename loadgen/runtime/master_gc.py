"""The master's memory: histogram garbage is collected on a clock, not on object counts.

Every hdrh ``HdrHistogram`` refers to itself through its encoder, so only the cyclic garbage
collector frees one, and its counts array (up to ~180 KiB at 1 µs..1 h, 3 digits) is invisible
to the collector's thresholds, which count objects, not bytes. The master makes dozens of them
a second (``decode_and_add`` builds a temporary one per worker delta and tag; a new set per hlog
interval). With the default thresholds they lived long enough to reach the oldest generation and
waited there for a full collection, which the large heap of Locust, Flask and gevent makes rare:
in a 30-minute soak (bench/soak.py) the master's RSS grew from 157 to 368 MiB (docs/soak.md).
Freezing the start-up heap and collecting every ``COLLECT_EVERY_S`` keeps it flat; the master
times no tokens, so a 3-4 ms pause there costs nothing.
"""

from __future__ import annotations

import gc

import gevent

COLLECT_EVERY_S = 5.0


def freeze_startup_heap() -> None:
    """Move everything alive now out of the collector's scans: later full collections are cheap."""
    gc.collect()
    gc.freeze()


def collect_periodically(every_s: float = COLLECT_EVERY_S) -> None:
    """Run forever in a greenlet: a full collection every ``every_s`` seconds."""
    while True:
        gevent.sleep(every_s)
        gc.collect()


__all__ = ["COLLECT_EVERY_S", "collect_periodically", "freeze_startup_heap"]
