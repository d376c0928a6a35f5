"""A worker process's set-up for a plan: its workload (``targets.quiet_gc`` keeps its collector quiet)."""

from __future__ import annotations

from typing import Any

from loadgen.config import RunConfig


def load_plan_workload(cfg: RunConfig) -> Any:
    """The workload on a worker: the master's file content when the path does not exist here."""
    from loadgen.run_workload import config_workload

    return config_workload(cfg)
