"""A worker process's set-up for a plan: its workload, and a garbage collector that keeps quiet."""

from __future__ import annotations

import gc
from typing import Any

from loadgen.config import RunConfig


def quiet_gc() -> None:
    """Keep the cyclic GC from stopping the driver for tens of milliseconds mid-run.

    A full collection over everything Locust, Flask and gevent imported took 20-35 ms; requests
    due then leave late and token chunks that arrive meanwhile are read together. Start-up
    objects are frozen out of the scans and full collections run less often; the driver's own
    data is acyclic and freed by reference counting.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(1_000, 50, 100)


def load_plan_workload(cfg: RunConfig) -> Any:
    """The workload on a worker: the master's file content when the path does not exist here."""
    from loadgen.run_workload import config_workload

    return config_workload(cfg)
