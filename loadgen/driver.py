"""The open-loop driver of one worker: sleep to each intended start, spawn the session, never wait.

Every worker builds the same global schedule from the seed and keeps arrival k when
``k % n_workers == slot`` (DESIGN §5), so the union over workers is exactly the single-process
schedule and session k is the same session whatever the worker count. Arrivals are never delayed
by the server: a slow server shows up as more sessions in flight, not as a lower rate.

Closed loop (``concurrency``) is offered for users who ask for it: ``concurrency`` agents run
sessions back to back; agent j takes sessions j, j+C, j+2C, ...; agents are split over workers
the same way as arrivals.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

import gevent
from gevent.event import Event
from gevent.pool import Pool

from analysis.records import RequestRecord
from loadgen.config import Plan, RunConfig
from loadgen.errors import UserError
from loadgen.session import InFlight, SessionContext, run_session, sleep_until_ns
from targets.registry import get_adapter
from workloads import arrivals
from workloads.errors import WorkloadError

log = logging.getLogger(__name__)

SESSION_LEAD_NS = 20_000_000  # 20 ms


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

        from targets.errors import TargetError
        from targets.tls import tls_context

        try:
            opts["ssl_context"] = tls_context(
                cfg.ca_cert, cfg.insecure_tls, ca_pem=cfg.ca_cert_pem, ssl_module=gevent.ssl
            )
        except TargetError as e:
            raise UserError(str(e)) from None
    return opts


def anchor_ns(t0_unix_s: float) -> int:
    """The perf_counter_ns instant that corresponds to the wall-clock run start ``t0_unix_s``."""
    return time.perf_counter_ns() + int((t0_unix_s - time.time()) * 1e9)


def build_schedule(plan: Plan, workload) -> list[tuple[int, float]]:
    """This worker's (session index, intended offset s) pairs, in order."""
    cfg = plan.config
    n = cfg.num_sessions
    if workload.num_sessions is not None:
        n = workload.num_sessions if n is None else min(n, workload.num_sessions)
    try:
        if cfg.arrival == "trace":
            # A trace bounds itself: take it whole, then cut to the sessions and duration asked.
            if cfg.trace_path:
                offsets = arrivals.trace(_trace_path(cfg), time_scale=cfg.trace_time_scale)
            else:
                offsets = workload.arrival_offsets()
                if offsets is None:
                    raise UserError("--arrival trace needs --trace FILE or a workload with timestamps")
                offsets = arrivals.rescale(offsets, time_scale=cfg.trace_time_scale)
            if cfg.trace_rate_per_s is not None:
                offsets = arrivals.rescale(offsets, rate_per_s=cfg.trace_rate_per_s)
            if n is not None:
                offsets = offsets[:n]
            if cfg.duration_s is not None:
                offsets = offsets[offsets < cfg.duration_s]
        else:
            offsets = arrivals.schedule(
                cfg.arrival,
                rate_per_s=cfg.rate_per_s,
                burstiness=cfg.burstiness,
                seed=cfg.seed,
                n=n,
                duration_s=None if n else cfg.duration_s,
            )
    except WorkloadError as e:
        raise UserError(str(e)) from None
    if n is not None and cfg.duration_s is not None:
        offsets = offsets[offsets < cfg.duration_s]
    mine = arrivals.worker_share(len(offsets), plan.n_workers, plan.slot)
    return [(int(k), float(offsets[k])) for k in mine]


def _trace_path(cfg) -> str:
    if cfg.trace_text is not None and not (cfg.trace_path and os.path.exists(cfg.trace_path)):
        import tempfile

        suffix = os.path.splitext(cfg.trace_path or "trace.txt")[1]
        fd, path = tempfile.mkstemp(prefix="loadgen-trace-", suffix=suffix)
        with os.fdopen(fd, "w") as f:
            f.write(cfg.trace_text)
        return path
    if not cfg.trace_path:
        raise UserError("--arrival trace needs --trace FILE")
    return cfg.trace_path


class Driver:
    """Runs one worker's share of a plan in its own greenlets (independent of any Locust user)."""

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
    ) -> None:
        """``recv_delays``: where streams append their receive delays (``loadgen.health``)."""
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
        cfg = plan.config
        self.t0_ns = anchor_ns(plan.t0_unix_s)
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
            t0_ns=self.t0_ns,
            on_record=on_record,
            is_stopping=lambda: self._stopping,
            in_flight=self.in_flight,
            connection_options={**connection_options(cfg), "recv_delays": recv_delays},
            tokenizer=getattr(workload, "tokenizer", None),
        )

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        target = self._closed_loop if self.plan.config.concurrency else self._open_loop
        self._greenlet = gevent.spawn(self._run, target)

    def _run(self, target: Callable[[], None]) -> None:
        try:
            target()
            self._pool.join()
        except Exception:
            log.exception("driver failed")
        finally:
            self.done.set()

    def stop_arrivals(self) -> None:
        """No new sessions and no new turns from now on; requests on the wire finish."""
        self._stopping = True

    def drain(self, deadline_s: float) -> None:
        """Stop arrivals, wait up to ``deadline_s`` for requests on the wire, then cancel the rest."""
        self.stop_arrivals()
        end = time.monotonic() + max(0.0, deadline_s)
        while self.in_flight.requests > 0 and time.monotonic() < end:
            gevent.sleep(0.02)
        self.requests_cancelled += self.in_flight.requests
        self.sessions_cancelled += len(self.in_flight.sessions)
        if self._greenlet is not None:
            self._greenlet.kill(block=False)
        self._pool.kill(block=True, timeout=5)
        self.done.set()

    @property
    def stopping(self) -> bool:
        return self._stopping

    # -- arrival loops -------------------------------------------------------------------------
    def _open_loop(self) -> None:
        cfg = self.plan.config
        for index, offset_s in build_schedule(self.plan, self.workload):
            if self._skip_before_s is not None and offset_s < self._skip_before_s:
                continue
            t_ns = self.t0_ns + int(offset_s * 1e9)
            # Start the session a little early: its prompt is built and its connection opened
            # before the intended time, which run_session then sleeps to.
            sleep_until_ns(t_ns - SESSION_LEAD_NS)
            if self._stopping:
                return
            session = self.workload.session(cfg.seed, index)
            self.sessions_started += 1
            self._pool.spawn(run_session, self.ctx, session, t_ns)

    def _closed_loop(self) -> None:
        cfg = self.plan.config
        concurrency = int(cfg.concurrency or 0)
        limit = cfg.num_sessions
        if self.workload.num_sessions is not None:
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
            session = self.workload.session(self.plan.config.seed, index)
            self.sessions_started += 1
            run_session(self.ctx, session, now)
            index += concurrency
