"""What every role of loadgen inside Locust shares: the message names, the timings, and the
driving side of a process (its driver, recorder and health).

One runtime hangs off each Locust ``Environment`` (``environment.loadgen``); its class follows
Locust's runner (``locust_runtime.install``): ``MasterRuntime`` (``master.py``), ``WorkerRuntime``
(``worker.py``) or ``LocalRuntime`` (``local.py``), the master and the local one sharing the
collecting side (``collector.py``). Everything attaches through events and ``register_message``;
no runner is subclassed or patched.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

import gevent

from analysis.records import RequestRecord
from loadgen.config import Plan
from loadgen.engine import http_reply
from loadgen.engine.driver import Driver, global_schedule
from loadgen.engine.health import SHIP_INTERVAL_S, GeneratorHealth
from loadgen.engine.recorder import Recorder
from loadgen.engine.worker_clock import (
    DEFAULT_MAX_CLOCK_OFFSET_S,
    parse_max_clock_offset,
)
from loadgen.errors import UserError
from loadgen.runtime.loss_timeouts import (
    DEFAULT_MASTER_LOSS_TIMEOUT_S,
    DEFAULT_WORKER_LOSS_TIMEOUT_S,
    parse_loss_timeout,
)
from loadgen.runtime.run_workload import config_workload

log = logging.getLogger("loadgen")

MSG_PLAN = "loadgen_plan"
MSG_DRAIN = "loadgen_drain"
MSG_FINAL = "loadgen_final"
MSG_DONE = "loadgen_done"
MSG_READY = "loadgen_ready"  # worker -> master: the plan is loaded, the target's set-up measured
MSG_GO = "loadgen_go"  # master -> worker: the run's clock starts at t0
MSG_ADOPT = "loadgen_adopt"  # master -> worker: also send part of a lost worker's arrivals
MSG_CHALLENGE = "loadgen_challenge"  # master -> worker: a nonce to answer with the join secret
MSG_AUTH = "loadgen_auth"  # worker -> master: HMAC-SHA256(secret, nonce || client id)
MSG_HELLO = "loadgen_hello"  # worker -> master: (re)send the challenge (it may have come before we listened)
MSG_CLOCK = "loadgen_clock"  # master -> worker -> master: clock stamps of a worker joining mid-run
MSG_DENIED = "loadgen_denied"  # master -> worker: the answer was wrong; this worker gets no part of the run

# The run starts this long after the last worker is ready, or three times the slowest worker's
# message round trip if that is longer: the go message reaches every worker before t0.
START_LEAD_LOCAL_S = 0.2
# The most the master waits for its workers to load the plan before it starts without the late.
READY_WAIT_S = 120.0
# The most a master waits for its workers to connect, or to handle Locust's spawn message, before
# it goes on regardless (Locust's own wait, and the drain barrier, handle a worker that never does).
SPAWN_WAIT_S = 5.0
# A headless master whose join secret is required waits this long, at the test start, for
# --expect-workers workers that proved it (Locust's own wait counts any client that connected).
VERIFIED_WAIT_S = 60.0
# A worker whose clock is off the master's by more than this is named in run.json's warnings.
CLOCK_OFFSET_WARN_S = 0.010



def tell_user(level: int, text: str) -> None:
    """One line for the user on stderr (``Error: ...`` or ``warning: ...``), said once.

    Locust's log goes to the same stderr by default, where a log record of it would print the
    message a second time; it is logged only when the log goes elsewhere (``--logfile``).
    """
    print(f"{'Error' if level >= logging.ERROR else 'warning'}: {text}", file=sys.stderr, flush=True)
    if not _log_reaches_stderr():
        log.log(level, "%s", text)


def _log_reaches_stderr() -> bool:
    logger: logging.Logger | None = log
    while logger is not None:
        for h in logger.handlers:
            if isinstance(h, logging.StreamHandler) and getattr(h, "stream", None) in (sys.stderr, sys.__stderr__):
                return True
        logger = logger.parent if logger.propagate else None
    return False


def off_the_loop(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` in a thread of the hub's pool, this greenlet waiting for it.

    Reading a large trace or dataset holds the CPU for seconds; on the event loop that would stop
    Locust's heartbeats (the master would take the worker for lost, the worker its master) and
    every message. In a thread the loop keeps running: the GIL is handed over every few ms.
    Only pure work goes there (parsing, numpy), never a gevent socket. An exception is raised
    here, in the caller (the pool would also print it as a traceback: a user's bad file is one
    line, never a traceback).
    """

    def call() -> tuple[bool, Any]:
        try:
            return False, fn(*args)
        except Exception as e:  # re-raised below, in the caller's greenlet
            return True, e

    failed, value = gevent.get_hub().threadpool.apply(call)
    if failed:
        raise value
    return value


class RuntimeBase:
    """What every role shares: the Locust environment, the options every process checks, and
    the driving side (a worker's, or the local process's): its driver, recorder and health."""

    role = ""  # "master" | "worker" | "local": run.json's generator role, and the logs'

    def __init__(self, environment: Any) -> None:
        self.env = environment
        self.recorder = Recorder(wire_records=self.role == "worker")  # a worker ships its records as dicts
        self.driver: Driver | None = None
        self.health: GeneratorHealth | None = None  # the event-loop lag and receive delays
        self.plan: Plan | None = None
        self._done_sent = False
        self._final_sent = False
        self._cpu_at_plan = time.process_time()
        self._wall_at_plan = time.monotonic()
        # heartbeat timeouts (loadgen/runtime/loss_timeouts.py): the master's wait for a silent
        # worker, a worker's for its silent master; checked in every process, as Locust's are
        self.worker_loss_timeout_s = self._loss_timeout("worker_loss_timeout", DEFAULT_WORKER_LOSS_TIMEOUT_S)
        self.master_loss_timeout_s = self._loss_timeout("master_loss_timeout", DEFAULT_MASTER_LOSS_TIMEOUT_S)
        self.max_clock_offset_s, self.allow_clock_offset = self._clock_bound()

    def install(self) -> None:
        """Attach this role's listeners and message handlers to the environment."""
        raise NotImplementedError

    def _clock_bound(self) -> tuple[float, bool]:
        """``--max-clock-offset`` and ``--allow-clock-offset``; a bad bound ends the process with a
        one-line error, as a bad loss timeout does."""
        options = getattr(self.env, "parsed_options", None)
        allow = bool(getattr(options, "allow_clock_offset", False))
        value = getattr(options, "max_clock_offset", None)
        if value in (None, ""):
            return DEFAULT_MAX_CLOCK_OFFSET_S, allow
        try:
            return parse_max_clock_offset(value), allow
        except ValueError as e:
            print(f"Error: --max-clock-offset: {e}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None

    def _loss_timeout(self, name: str, default_s: float) -> float:
        """A loss timeout from Locust's options; a bad one ends the process with a one-line error
        (the ``loadgen`` front checks them first; this covers the stock ``locust -f``)."""
        value = getattr(getattr(self.env, "parsed_options", None), name, None)
        if value in (None, ""):
            return default_s
        try:
            return parse_loss_timeout("--" + name.replace("_", "-"), value)
        except UserError as e:
            print(f"Error: {e.message}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None

    def _prepare_driver(self, plan: Plan, worker_id: str, skip_before_s: float | None = None) -> None:
        """Load the plan's workload and build its driver (schedule, connection set-up measured);
        it starts with ``driver.start`` when the run's clock does."""
        cfg = plan.config
        api_key = os.environ.get(cfg.api_key_env) if cfg.api_key_env else None
        workload = off_the_loop(config_workload, cfg)  # the master's file content if the path is not here
        schedule = None if cfg.concurrency else off_the_loop(lambda: global_schedule(cfg, workload, count=False))
        self.recorder = Recorder(wire_records=self.role == "worker")  # a worker ships its records as dicts
        self.plan = plan
        self._done_sent = False
        self._final_sent = False
        if self.health is not None:
            self.health.stop()
        self.health = GeneratorHealth()
        self.health.start()
        self.driver = Driver(
            plan,
            worker_id=worker_id,
            workload=workload,
            on_record=self._on_record,
            api_key=api_key,
            skip_before_s=skip_before_s,
            recv_delays=self.health.recv_delays_ns,
            schedule=schedule,
        )
        in_flight = self.driver.in_flight
        self.health.busy = lambda: in_flight.requests > 0  # the loop-lag probe's pace

    def _on_record(self, rec: RequestRecord) -> None:
        self.recorder.record_request(rec)
        ms = (rec.e2e_us or 0) / 1000.0
        exc = None if rec.ok else RuntimeError(f"{rec.error_category}: {rec.error_message or ''}".strip())
        self.env.events.request.fire(
            request_type="LLM",
            name=rec.turn_class,
            response_time=ms,
            response_length=rec.output_tokens,
            exception=exc,
            context={"session_id": rec.session_id, "turn": rec.turn_index},
        )

    def _headless(self) -> bool:
        return bool(getattr(self.env.parsed_options, "headless", False))

    def _driver_state(self, final: bool = False) -> dict[str, Any]:
        """The driver's state as a worker reports it: sessions, requests, its CPU and health."""
        d = self.driver
        return {
            "started": d.sessions_started if d else 0,
            "sessions": sorted(d.in_flight.sessions) if d else [],
            "requests": d.in_flight.requests if d else 0,
            "requests_cancelled": d.requests_cancelled if d else 0,
            "sessions_cancelled": d.sessions_cancelled if d else 0,
            "pid": os.getpid(),  # names the process when the worker is lost
            # The generator's own CPU, so a saturated client is never mistaken for a slow server.
            "cpu_s": round(time.process_time() - self._cpu_at_plan, 4),
            "wall_s": round(time.monotonic() - self._wall_at_plan, 4),
            "health": (self.health.state(max_age_s=0.0 if final else SHIP_INTERVAL_S) if self.health else {}),
            "reader": http_reply.READER,  # which body reader streams its replies (run.json ``reader``)
            # Connections opened and sessions that took a kept one (run.json ``connections``).
            "connections": d.ctx.connections.counts() if d and d.ctx.connections is not None else {},
        }

    def _worker_payload(self, final: bool = False) -> dict[str, Any]:
        """What a worker ships with each report: the histograms and records since the last one,
        and its state (``engine.recorder.Delta`` on the wire)."""
        delta = self.recorder.take_delta().to_wire()
        delta["run_id"] = self.plan.config.run_id if self.plan else None
        delta["state"] = self._driver_state(final)
        return delta
