"""The arrival offsets the run's flags make, for both schedules (``driver.global_schedule`` and
``plan_stream.streamed_schedule``): a ``--trace`` file's times (or the workload's own), a generated
``--arrival`` process, and the ``--duration`` cut. Offsets are seconds from the run start,
ascending; the same flags give the same offsets on the master and on every worker.
"""

from __future__ import annotations

import numpy as np

from loadgen.config import RunConfig
from loadgen.engine.trace_file import trace_path_here
from workloads import arrivals


def trace_offsets(cfg: RunConfig, own: np.ndarray | None = None) -> np.ndarray:
    """``--arrival trace``: the ``--trace`` file's times, or ``own`` (the workload's timestamps)
    when there is no file, scaled by ``--trace-time-scale`` and then to ``--trace-rate``."""
    if cfg.trace_path:
        offsets = arrivals.trace(trace_path_here(cfg), time_scale=cfg.trace_time_scale)
    else:
        offsets = arrivals.rescale(own, time_scale=cfg.trace_time_scale)
    if cfg.trace_rate_per_s is not None:
        offsets = arrivals.rescale(offsets, rate_per_s=cfg.trace_rate_per_s)
    return offsets


def generated_offsets(cfg: RunConfig, n: int | None, duration_s: float | None) -> np.ndarray:
    """``n`` arrivals (or as many as fall in ``duration_s``) of the ``--arrival`` process at
    ``--rate`` and ``--burstiness``, from ``--seed``."""
    return arrivals.schedule(
        cfg.arrival, rate_per_s=cfg.rate_per_s, burstiness=cfg.burstiness, seed=cfg.seed, n=n, duration_s=duration_s
    )


def cut_at_duration(offsets: np.ndarray, duration_s: float | None) -> tuple[np.ndarray, bool]:
    """``offsets`` less those at or after ``duration_s``, and whether any were cut."""
    if duration_s is not None and len(offsets) and offsets[-1] >= duration_s:
        return offsets[offsets < duration_s], True
    return offsets, False
