"""What a live view may read of a running test: ``RunSnapshot``, taken by the runtime on demand.

The views (the web UI tabs, ``/metrics``) run in the master's event loop between its other work,
and they read only this: never the runtime's own attributes, so the runtime can change how it
keeps its state, and every view counts workers, sessions and requests the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from loadgen.config import RunConfig


@dataclass(frozen=True)
class RunSnapshot:
    """The current run, as the runtime sees it at the moment it is asked."""

    config: RunConfig | None  # None before the first run starts
    # The master's merged histograms and counters (``engine.recorder.MetricsAggregate``): the
    # live object, not a copy (its histograms are large); views only read it.
    aggregate: Any
    t0_unix_s: float  # when the run's schedule starts; 0.0 before a run
    t_end_unix_s: float | None  # when its results were closed; None while it runs
    sessions_started: int = 0
    sessions_in_flight: int = 0
    requests_in_flight: int = 0
    # Workers by state (active, lost, standby) on a master; {"active": 1} for a local run. A lost
    # worker that came back and was merged again counts as active.
    workers: dict[str, int] = field(default_factory=dict)
    # (coalesced, token chunks) from the workers' own counts, as the final verdict reads them
    # (``engine.health.coalescing_counts``); None where no worker has reported them.
    coalescing: tuple[int, int] | None = None
    # The run's planned session arrivals (runtime.accounting): None for a closed loop bounded by
    # time, or before a run.
    arrivals_planned: int | None = None


SnapshotSource = Callable[[], RunSnapshot]

__all__ = ["RunSnapshot", "SnapshotSource"]
