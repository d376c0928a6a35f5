"""Streamed schedules: a large trace's arrivals read from the file as they come due.

A ``StreamedSchedule`` is the run's global schedule (``loadgen.engine.driver.Schedule``) for a
``workloads.streamed.StreamedTraceWorkload``: nothing is held but the file's path and how its
times map to offsets. Each worker reads the file itself, row by row, and keeps its own share
(``share_arrivals``: session k belongs to slot ``k % n``, narrowed by re-planning splits), so
session k is row k whatever the number of workers, and a lost worker's share is re-read by the
survivors that adopt it. The master reads the file too, to count the planned sessions: up to the
cut (``--num-sessions``, ``--duration``) before the start, or, for a replay of the whole file, in
a thread during the run (``count_in_background``), and to count a lost worker's due arrivals.

Why workers read their own shares rather than the master handing out slices: the plan protocol
stays what it is (slot, splits, from_s), re-planning needs no state but those numbers, and no
message grows with the file.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from loadgen.config import RunConfig
from loadgen.engine.arrival_offsets import cut_at_duration, generated_offsets, trace_offsets
from loadgen.engine.arrival_share import in_share
from loadgen.errors import UserError
from workloads.errors import WorkloadError
from workloads.streamed import StreamedTraceWorkload

log = logging.getLogger("loadgen")

# A share's reader hands the event loop back this often (rows scanned), so that skipping many
# rows (a late takeover, a narrow re-planned share) never stalls heartbeats.
PAUSE_EVERY_ROWS = 256  # ~1 ms of parsing

Arrival = tuple[int, float, "dict[str, Any] | None"]  # (session index, offset s, record)


class StreamedSchedule:
    """The run's arrivals from a streamed trace (see the module docstring).

    Offsets are ``(t - t_first) * scale`` of the rows' own times, or ``offsets[k]`` when the
    arrivals are generated (``--arrival poisson`` over a trace's sessions). ``n_limit`` and
    ``duration_s`` cut it as ``--num-sessions`` and ``--duration`` do. ``planned`` is the number of
    arrivals once counted (None until then), ``available`` the sessions the file holds when known.
    """

    streamed = True

    def __init__(
        self,
        workload: StreamedTraceWorkload,
        *,
        scale: float = 1.0,
        t_first_s: float = 0.0,
        offsets: Any = None,
        n_limit: int | None = None,
        duration_s: float | None = None,
    ) -> None:
        self.workload = workload
        self.scale = float(scale)
        self.t_first_s = t_first_s
        self._offsets = offsets
        self.n_limit = n_limit
        self.duration_s = duration_s
        self.planned: int | None = None if offsets is None else len(offsets)
        self.available: int | None = None
        self.cut_by: list[str] = []

    def arrivals(self, pause: Callable[[], None] | None = None) -> Iterator[Arrival]:
        """Every arrival of the run in order: (session index, offset s, record)."""
        offsets, scale, t_first = self._offsets, self.scale, self.t_first_s
        n_limit, duration = self.n_limit, self.duration_s
        for k, row in enumerate(self.workload.rows()):
            if pause is not None and k % PAUSE_EVERY_ROWS == PAUSE_EVERY_ROWS - 1:
                pause()
            if n_limit is not None and k >= n_limit:
                return
            if offsets is not None:
                if k >= len(offsets):
                    return
                off = float(offsets[k])
            else:
                off = (row.time_s - t_first) * scale
            if duration is not None and off >= duration:
                return
            yield k, off, row.record

    def share_arrivals(
        self,
        n_slots: int,
        slot: int,
        splits: list[list[int]] | None = None,
        from_s: float | None = None,
        pause: Callable[[], None] | None = None,
    ) -> Iterator[Arrival]:
        """The arrivals of slot ``slot`` narrowed by ``splits``, due at ``from_s`` or later."""
        for k, off, rec in self.arrivals(pause):
            if in_share(k, n_slots, slot, splits) and (from_s is None or off >= from_s):
                yield k, off, rec

    def due(self, n_slots: int, shares: Iterable[Any]) -> int:
        """How many arrivals of ``shares`` (``loadgen.runtime.accounting.Share``) fall in their time
        ranges: one pass over the file."""
        shares = list(shares)
        if not shares:
            return 0
        total = 0
        for k, off, _ in self.arrivals():
            for sh in shares:
                if sh.from_s <= off < sh.until_s and in_share(k, n_slots, sh.slot, sh.splits):
                    total += 1
        return total

    def count_planned(self) -> int:
        """Count the arrivals (one pass up to the cut, each row validated) and note what cut them,
        as the whole-file schedule tells it (``loadgen.engine.driver.global_schedule``)."""
        if self._offsets is not None:
            self.planned = len(self._offsets)
            return self.planned
        n_limit, duration, scale, t_first = self.n_limit, self.duration_s, self.scale, self.t_first_s
        n = 0
        stopped_by = None
        for k, row in enumerate(self.workload.rows()):
            if n_limit is not None and k >= n_limit:
                stopped_by = "--num-sessions"
                break
            if duration is not None and (row.time_s - t_first) * scale >= duration:
                stopped_by = "--duration"
                break
            n += 1
        if stopped_by == "--duration" and n_limit is not None:
            # Cut by both when the file also holds more than --num-sessions rows.
            more = self.workload.sessions_available(at_most=n_limit + 1) > n_limit
            self.cut_by = ["--num-sessions", "--duration"] if more else ["--duration"]
        else:
            self.cut_by = [stopped_by] if stopped_by else []
        if stopped_by is None:
            self.available = n  # the whole file was read
        self.planned = n
        return n


def streamed_schedule(cfg: RunConfig, workload: StreamedTraceWorkload, *, count: bool = True) -> StreamedSchedule:
    """The run's schedule over a streamed trace. ``count``: count the planned arrivals now when
    the run is cut (a bounded read); a run of the whole file is counted by ``count_in_background``."""
    if cfg.arrival != "trace" or cfg.trace_path:
        return _generated(cfg, workload)
    if not workload.has_arrival_times():
        raise UserError("--arrival trace needs --trace FILE or a workload with timestamps")
    first = next(iter(_times(workload)))
    scale = cfg.trace_time_scale
    available = None
    if cfg.trace_rate_per_s is not None:
        # The mean rate is (n - 1) / span over the whole trace: one pass before the start.
        n, last = 0, first
        for n, last in enumerate(_times(workload), start=1):  # noqa: B007
            pass
        span = last - first
        if n < 2 or span <= 0:
            raise UserError("arrivals: cannot rescale a trace to a rate: all its arrivals are at one instant")
        scale = (n - 1) / span / float(cfg.trace_rate_per_s)
        available = n
    sched = StreamedSchedule(
        workload, scale=scale, t_first_s=first, n_limit=cfg.num_sessions, duration_s=cfg.duration_s
    )
    sched.available = available
    if count and (cfg.num_sessions is not None or cfg.duration_s is not None):
        sched.count_planned()
    return sched


def _times(workload: StreamedTraceWorkload) -> Iterator[float]:
    for row in workload.rows():
        assert row.time_s is not None
        yield row.time_s


def _generated(cfg: RunConfig, workload: StreamedTraceWorkload) -> StreamedSchedule:
    """Arrivals from ``--arrival`` (or a ``--trace`` file) over the trace's sessions in file order."""
    n = cfg.num_sessions
    cut_by: list[str] = []
    if n is not None:
        held = workload.sessions_available(at_most=n + 1)
        if held > n:
            cut_by.append("--num-sessions")
        available = held if held <= n else None
        n = min(n, held)
    else:
        available = n = workload.num_sessions
    offsets = trace_offsets(cfg)[:n] if cfg.arrival == "trace" else generated_offsets(cfg, n, None)
    offsets, cut = cut_at_duration(offsets, cfg.duration_s)
    if cut:
        cut_by.append("--duration")
    sched = StreamedSchedule(workload, offsets=offsets)
    sched.available = available
    sched.cut_by = cut_by
    return sched


def count_in_background(schedule: Any, accounting: Any, on_error: Callable[[str], None]) -> Any:
    """For a streamed schedule not yet counted (a replay of the whole file): count it in a thread
    during the run, filling in ``accounting``; a bad row found meanwhile goes to ``on_error``.
    Returns the greenlet to join before the accounting closes (None: nothing to count)."""
    if not getattr(schedule, "streamed", False) or schedule.planned is not None:
        return None
    import gevent

    def count() -> None:
        try:
            n = gevent.get_hub().threadpool.apply(schedule.count_planned)
        except WorkloadError as e:
            on_error(str(e))
            return
        except OSError as e:  # the file went away or became unreadable during the run
            on_error(f"{getattr(schedule.workload, 'source', 'the trace')}: cannot be read to the end ({e.strerror or e})")
            return
        except Exception as e:  # a bug, not the user's: still no run without its accounting
            log.exception("counting the streamed trace failed")
            on_error(f"the streamed trace could not be counted ({type(e).__name__}: {e})")
            return
        accounting.arrivals_planned = n
        accounting.sessions_available = schedule.available
        log.info("loadgen: %d sessions planned (the trace was counted during the run)", n)

    return gevent.spawn(count)
