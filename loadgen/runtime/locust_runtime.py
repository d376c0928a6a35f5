"""loadgen inside Locust: the runtime each Locust ``Environment`` gets, chosen by its runner.

* **local** (no master/worker; ``local.py``): drives, records and writes results in one process.
* **master** (``master.py``): plans for every worker, their joins, clocks and losses, the exact
  merge of their reports; with the local runtime it shares the collecting side
  (``collector.py``): results, the drain barrier at the stop, the verdict.
* **worker** (``worker.py``): runs its ``Driver`` for the plan it got; ships deltas with every
  Locust report and a final one when drained or done.

What all three share (message names, timings, the driving side) is ``base.py``. The runtime hangs
off the environment as ``environment.loadgen``, so a master and workers can share one test process.
Everything attaches through events and ``register_message``; no runner is subclassed or patched.
"""

from __future__ import annotations

from typing import Any

from locust.runners import MasterRunner, WorkerRunner

from loadgen.runtime.base import RuntimeBase
from loadgen.runtime.local import LocalRuntime
from loadgen.runtime.master import MasterRuntime
from loadgen.runtime.worker import WorkerRuntime


def runtime_for(environment: Any) -> RuntimeBase:
    """The runtime for this environment's role: its runner says which."""
    runner = environment.runner
    if isinstance(runner, MasterRunner):
        return MasterRuntime(environment)
    if isinstance(runner, WorkerRunner):
        return WorkerRuntime(environment)
    return LocalRuntime(environment)


def install(environment: Any) -> RuntimeBase:
    """Attach loadgen to a Locust environment (called from the locustfile's init listener)."""
    rt = runtime_for(environment)
    environment.loadgen = rt
    rt.install()
    return rt


__all__ = ["install", "runtime_for"]
