"""The open-loop driver of one worker: sleep to each intended start, spawn the session, never wait.

Every worker builds the same global schedule from the seed and keeps arrival k when
``k % n_workers == slot`` (docs/distributed.md), so the union over workers is exactly the single-process
schedule and session k is the same session whatever the worker count. Arrivals are never delayed
by the server: a slow server shows up as more sessions in flight, not as a lower rate.

Closed loop (``concurrency``) is offered for users who ask for it: ``concurrency`` agents run
sessions back to back; agent j takes sessions j, j+C, j+2C, ...; agents are split over workers
the same way as arrivals.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import gevent
import numpy as np
from gevent.event import Event
from gevent.pool import Pool

from analysis.records import RequestRecord
from loadgen.config import Plan, RunConfig
from loadgen.engine.arrival_offsets import cut_at_duration, generated_offsets, trace_offsets
from loadgen.engine.arrival_share import share_indices
from loadgen.engine.connection_pool import ConnectionPool
from loadgen.engine.session import InFlight, SessionContext, new_connection, run_session, sleep_until_ns
from loadgen.errors import UserError
from targets.registry import get_adapter
from workloads.errors import WorkloadError

log = logging.getLogger(__name__)

# How long before a session's first turn its prompt is built and its connection opened: at least
# this, and more for a far target (twice its measured connect time, see ``session_lead_ns``), so a
# first turn never waits for a connection that a pooled client would already hold.
MIN_SESSION_LEAD_NS = 20_000_000  # 20 ms
MAX_SESSION_LEAD_NS = 2_000_000_000


def connection_options(cfg: RunConfig) -> dict[str, Any]:
    """The ``SessionConnection`` keywords a run's config sets beyond the basics (one TLS context
    per worker: building it reads the trust store)."""
    opts: dict[str, Any] = {
        "first_byte_timeout_s": cfg.first_byte_timeout_s,
        "idle_timeout_s": cfg.idle_timeout_s,
        "retry_after_cap_s": cfg.retry_after_cap_s,
    }
    if cfg.target_url.startswith("https:"):
        import gevent.ssl

        from targets.tls import tls_context

        opts["ssl_context"] = tls_context(cfg.ca_cert, cfg.insecure_tls, ca_pem=cfg.ca_cert_pem, ssl_module=gevent.ssl)
    return opts


def anchor_ns(t0_unix_s: float) -> int:
    """The perf_counter_ns instant that corresponds to the run start ``t0_unix_s`` on this worker's
    wall clock (``loadgen.engine.worker_clock``: the master's t0 plus this worker's measured offset)."""
    from loadgen.engine.worker_clock import worker_wall_time

    return time.perf_counter_ns() + int((t0_unix_s - worker_wall_time()) * 1e9)


@dataclass
class Schedule:
    """The run's global arrival offsets (s from the run start, ascending) and how they were cut.

    ``available`` is how many sessions the workload holds (None: it generates them without end);
    ``cut_by`` names what made the schedule shorter than a trace or session file: ``--duration``,
    ``--num-sessions``.
    """

    offsets: np.ndarray
    available: int | None = None
    cut_by: list[str] = field(default_factory=list)
    streamed = False  # a loadgen.engine.plan_stream.StreamedSchedule reads its arrivals from the file

    @property
    def planned(self) -> int:
        return len(self.offsets)

    def share_arrivals(
        self,
        n_slots: int,
        slot: int,
        splits: list[list[int]] | None = None,
        from_s: float | None = None,
        pause: Callable[[], None] | None = None,
    ) -> Iterator[tuple[int, float, None]]:
        """(session index, offset s, None) of slot ``slot``'s arrivals narrowed by ``splits``, due at
        ``from_s`` or later; the workload builds session k by index."""
        offsets = self.offsets
        for k in share_indices(len(offsets), n_slots, slot, splits):
            if from_s is None or offsets[k] >= from_s:
                yield int(k), float(offsets[k]), None

    def due(self, n_slots: int, shares: Iterable[Any]) -> int:
        """How many arrivals of ``shares`` (``loadgen.runtime.accounting.Share``) fall in their time ranges."""
        total = 0
        for sh in shares:
            t = self.offsets[share_indices(len(self.offsets), n_slots, sh.slot, sh.splits)]
            total += int(np.count_nonzero((t >= sh.from_s) & (t < sh.until_s)))
        return total


def global_schedule(cfg: RunConfig, workload, *, count: bool = True) -> Schedule:
    """Every arrival of the run, the same on the master and on every worker (docs/distributed.md).

    A streamed trace (``workloads.streamed``) gets a ``loadgen.engine.plan_stream.StreamedSchedule``, read
    from the file as its arrivals come due; ``count`` (the master) counts its planned arrivals
    when the run is cut.
    """
    from workloads.streamed import StreamedTraceWorkload

    if isinstance(workload, StreamedTraceWorkload):
        from loadgen.engine.plan_stream import streamed_schedule

        return streamed_schedule(cfg, workload, count=count)  # type: ignore[return-value]
    n = cfg.num_sessions
    available = workload.num_sessions
    if available is not None:
        n = available if n is None else min(n, available)
    cut_by: list[str] = []
    if cfg.arrival == "trace":
        # A trace bounds itself: take it whole, then cut to the sessions and duration asked.
        own = None if cfg.trace_path else workload.arrival_offsets()
        if own is None and not cfg.trace_path:
            raise UserError("--arrival trace needs --trace FILE or a workload with timestamps")
        offsets = trace_offsets(cfg, own)
        available = len(offsets) if available is None else min(available, len(offsets))
        if n is not None and n < len(offsets):
            offsets = offsets[:n]
            cut_by.append("--num-sessions")
        offsets, cut = cut_at_duration(offsets, cfg.duration_s)
        if cut:
            cut_by.append("--duration")
    else:
        offsets = generated_offsets(cfg, n, None if n else cfg.duration_s)
        if cfg.num_sessions and available is not None and cfg.num_sessions < available:
            cut_by.append("--num-sessions")
    if n is not None:
        offsets, cut = cut_at_duration(offsets, cfg.duration_s)
        if cut and "--duration" not in cut_by:
            cut_by.append("--duration")
    return Schedule(offsets, available, cut_by)


def build_schedule(plan: Plan, workload) -> list[tuple[int, float]]:
    """This worker's (session index, intended offset s) pairs, in order."""
    schedule = global_schedule(plan.config, workload, count=False)
    return [(k, off) for k, off, _ in schedule.share_arrivals(plan.n_workers, plan.slot)]


def _hand_back() -> None:
    """Let the event loop run (heartbeats, messages) while a streamed share skips rows."""
    gevent.sleep(0)


def measure_connect_s(base_url: str, options: dict[str, Any], tries: int = 3) -> float | None:
    """The slowest of ``tries`` connection set-ups to the target (TCP, and TLS for https), in s;
    None when none succeeded (the run's requests will say why)."""
    from loadgen.engine.client import SessionConnection

    times = []
    kwargs = {k: v for k, v in options.items() if k != "recv_delays"}
    for _ in range(tries):
        # A target that cannot be reached is the requests' to report: one short try, no more.
        conn = SessionConnection(base_url, connect_timeout_s=2.0, **kwargs)
        t = time.perf_counter()
        conn.preconnect()
        opened = conn.connections_opened
        conn.close()
        if not opened:
            break
        times.append(time.perf_counter() - t)
    return max(times) if times else None


def session_lead_ns(connect_s: float | None) -> int:
    """How far ahead of its first turn a session opens its connection: twice the measured set-up
    time (a far or slow target), at least 20 ms, at most 2 s."""
    if connect_s is None:
        return MIN_SESSION_LEAD_NS
    return int(min(MAX_SESSION_LEAD_NS, max(MIN_SESSION_LEAD_NS, 2 * connect_s * 1e9)))


class Driver:
    """Runs one worker's share of a plan in its own greenlets (independent of any Locust user).

    Made in two steps, so the run's clock starts only once every worker is ready: the constructor
    builds the schedule and measures the target's connection set-up (``ready_info``); ``start``
    anchors the clock at the run's start and begins the arrivals. ``adopt`` adds a lost worker's
    share (its arrivals from a given time on) to a running driver.
    """

    def __init__(
        self,
        plan: Plan,
        *,
        worker_id: str,
        workload,
        on_record: Callable[[RequestRecord], None],
        api_key: str | None,
        skip_before_s: float | None = None,
        recv_delays: list[int] | None = None,
        schedule: Schedule | None = None,
    ) -> None:
        """``recv_delays``: where streams append their receive delays (``loadgen.engine.health``);
        ``schedule``: the run's global schedule when the caller built it already."""
        t_prep = time.perf_counter()
        self.plan = plan
        self.worker_id = worker_id
        self.workload = workload
        self.in_flight = InFlight()
        self.sessions_started = 0
        self.sessions_cancelled = 0
        self.requests_cancelled = 0
        self._stopping = False
        self._skip_before_s = skip_before_s
        self.done = Event()
        self._pool = Pool()
        self._greenlet: gevent.Greenlet | None = None
        self._runner: gevent.Greenlet | None = None
        cfg = plan.config
        options = {**connection_options(cfg), "recv_delays": recv_delays}
        self.ctx = SessionContext(
            run_id=cfg.run_id,
            worker_id=worker_id,
            base_url=cfg.target_url,
            adapter=get_adapter(cfg.adapter, **cfg.adapter_options),
            model=cfg.model,
            target_label=cfg.target_label,
            session_header=cfg.session_header,
            request_timeout_s=cfg.request_timeout_s,
            connect_timeout_s=cfg.connect_timeout_s,
            api_key=api_key,
            extra_headers=dict(cfg.extra_headers),
            t0_ns=0,
            on_record=on_record,
            is_stopping=lambda: self._stopping,
            in_flight=self.in_flight,
            connection_options=options,
            tokenizer=getattr(workload, "tokenizer", None),
        )
        self.ctx.connections = ConnectionPool(functools.partial(new_connection, self.ctx), cfg.connections)
        self.t0_ns = 0
        if schedule is None and not cfg.concurrency:
            schedule = global_schedule(cfg, workload, count=False)
        self.schedule = schedule
        self.connect_s = None if cfg.concurrency else measure_connect_s(cfg.target_url, options)
        self.session_lead_ns = session_lead_ns(self.connect_s)
        self.prepare_s = time.perf_counter() - t_prep

    def ready_info(self) -> dict[str, Any]:
        """What the master needs to start the clock: how long the set-up took, what it measured."""
        return {
            "prepare_s": round(self.prepare_s, 4),
            "connect_s": None if self.connect_s is None else round(self.connect_s, 6),
            "session_lead_ms": round(self.session_lead_ns / 1e6, 3),
        }

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self, t0_unix_s: float | None = None) -> None:
        """Anchor the clock at the run start ``t0_unix_s`` (default: the plan's) and begin."""
        self.t0_ns = self.ctx.t0_ns = anchor_ns(self.plan.t0_unix_s if t0_unix_s is None else t0_unix_s)
        target = self._closed_loop if self.plan.config.concurrency else self._open_loop
        self._greenlet = gevent.spawn(target)
        self._runner = gevent.spawn(self._run)

    def _run(self) -> None:
        try:
            if self._greenlet is not None:
                self._greenlet.join()
            self._pool.join()  # sessions, and any adopted share's arrivals, however late they came
        except Exception:
            log.exception("driver failed")
        finally:
            self.ctx.connections.close()
            self.done.set()

    def adopt(self, slot: int, splits: list[list[int]], from_s: float) -> bool:
        """Also send slot ``slot``'s arrivals narrowed by ``splits`` (``share_indices``) that are due
        at ``from_s`` or later: a lost worker's share. False when this driver can no longer."""
        if self._stopping or self.schedule is None or not self.t0_ns:
            return False
        share = self.schedule.share_arrivals(self.plan.n_workers, slot, splits, from_s, pause=_hand_back)
        self._pool.spawn(self._arrivals, share)
        if self.done.is_set():
            self.done.clear()
            self._greenlet = None
            self._runner = gevent.spawn(self._run)
        return True

    def stop_arrivals(self) -> None:
        """No new sessions and no new turns from now on; requests on the wire finish."""
        self._stopping = True

    def drain(self, deadline_s: float) -> None:
        """Stop arrivals, wait up to ``deadline_s`` for requests on the wire, then cut the rest:
        each records what arrived as ``cut_at_stop`` (loadgen.engine.session)."""
        self.stop_arrivals()
        end = time.monotonic() + max(0.0, deadline_s)
        while self.in_flight.requests > 0 and time.monotonic() < end:
            gevent.sleep(0.02)
        self.requests_cancelled += self.in_flight.requests
        self.sessions_cancelled += len(self.in_flight.sessions)
        if self._greenlet is not None:
            self._greenlet.kill(block=False)
        self._pool.kill(block=True, timeout=5)
        self.ctx.connections.close()
        self.done.set()

    @property
    def stopping(self) -> bool:
        return self._stopping

    # -- arrival loops -------------------------------------------------------------------------
    def _open_loop(self) -> None:
        assert self.schedule is not None
        plan = self.plan
        self._arrivals(self.schedule.share_arrivals(plan.n_workers, plan.slot, None, self._skip_before_s, _hand_back))

    def _arrivals(self, share: Iterable[tuple[int, float, dict[str, Any] | None]]) -> None:
        """Start each arrival of ``share`` at its time. A streamed share is read from the file as
        it goes (``loadgen.engine.plan_stream``): each session is built from its record."""
        try:
            self._start_arrivals(share)
        except WorkloadError as e:  # a bad row of a streamed trace; the master's count names it too
            log.error("worker stops its arrivals: %s", e)

    def _start_arrivals(self, share: Iterable[tuple[int, float, dict[str, Any] | None]]) -> None:
        cfg = self.plan.config
        lead_ns = self.session_lead_ns
        pool = self.ctx.connections
        for index, offset_s, record in share:
            t_ns = self.t0_ns + int(offset_s * 1e9)
            # Each session starts at most the lead ahead of its time: its prompt is built and its
            # connection opened (or the kept one it took checked) before its first turn, which
            # run_session then sleeps to. A kept connection that waits, open, is taken for it
            # here instead, and the session is spawned at its time: it has nothing to open, and
            # saves a wake-up of its own (a timer and two switches) per session.
            if t_ns - time.perf_counter_ns() > lead_ns:
                sleep_until_ns(t_ns - lead_ns)
                if self._stopping:
                    return
            conn = pool.take_open() if pool is not None else None
            try:
                if record is None:
                    session = self.workload.session(cfg.seed, index)
                else:
                    session = self.workload.record_session(cfg.seed, index, record)
                if conn is not None:
                    sleep_until_ns(t_ns)
                    if self._stopping:
                        return
                self.sessions_started += 1
                self._pool.spawn(run_session, self.ctx, session, t_ns, conn)
                conn = None
            finally:
                if conn is not None:  # stopped, or killed, while it waited for the session's time
                    pool.untake(conn)

    def _closed_loop(self) -> None:
        cfg = self.plan.config
        concurrency = int(cfg.concurrency or 0)
        limit = cfg.num_sessions
        if getattr(self.workload, "streams_sessions", False):
            pass  # a streamed trace is not counted here: an agent stops at its end (_agent)
        elif self.workload.num_sessions is not None:
            limit = self.workload.num_sessions if limit is None else min(limit, self.workload.num_sessions)
        deadline_ns = None if cfg.duration_s is None else self.t0_ns + int(cfg.duration_s * 1e9)
        sleep_until_ns(self.t0_ns)
        for agent in range(self.plan.slot, concurrency, self.plan.n_workers):
            self._pool.spawn(self._agent, agent, concurrency, limit, deadline_ns)

    def _agent(self, agent: int, concurrency: int, limit: int | None, deadline_ns: int | None) -> None:
        index = agent
        while not self._stopping and (limit is None or index < limit):
            now = time.perf_counter_ns()
            if deadline_ns is not None and now >= deadline_ns:
                return
            try:
                session = self.workload.session(self.plan.config.seed, index)
            except WorkloadError:  # past a streamed trace's last row (or a bad row: the master names it)
                return
            self.sessions_started += 1
            run_session(self.ctx, session, now)
            index += concurrency
