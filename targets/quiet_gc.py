"""Keep the cyclic garbage collector from pausing a process that times or relays token streams.

A full collection over everything Locust, Flask, aiohttp and gevent import takes 15-35 ms; in a
load generator's worker, requests due then leave late and chunks that arrive meanwhile are read
together; in a server or a proxy, every stream's next chunk waits. Everything alive after start-up
is frozen out of the collector's scans, and collections run less often. What these processes make
per request is acyclic and freed by reference counting.
"""

from __future__ import annotations

import gc

__all__ = ["quiet_gc"]


def quiet_gc() -> None:
    """Freeze the start-up heap and raise the collection thresholds (call once start-up is done)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(1_000, 50, 100)
