"""A worker of a distributed run, inside Locust: it proves the join secret, loads the plan the
master sends (pulling a streamed trace its host lacks), says READY with its clock stamps, starts
its driver at GO, ships a delta with every Locust report, adopts a lost worker's arrivals when
told, and sends a final report when drained, done, or stopped on its own.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from typing import Any

import gevent
from locust.runners import STATE_INIT

from loadgen.config import Plan
from loadgen.engine.driver import Driver
from loadgen.engine.worker_clock import (
    worker_wall_time,
)
from loadgen.errors import UserError
from loadgen.runtime.base import (
    MSG_ADOPT,
    MSG_AUTH,
    MSG_CHALLENGE,
    MSG_CLOCK,
    MSG_DENIED,
    MSG_DONE,
    MSG_DRAIN,
    MSG_FINAL,
    MSG_GO,
    MSG_HELLO,
    MSG_PLAN,
    MSG_READY,
    RuntimeBase,
    tell_user,
)
from loadgen.runtime.file_ship import (
    MSG_FILE_CHUNK,
    FileFetch,
    fetched_config,
    needs_fetch,
)
from loadgen.runtime.helper_threads import yield_helper_threads
from loadgen.runtime.join_auth import (
    SECRET_ENV,
    response,
)
from loadgen.runtime.loss_timeouts import (
    DEFAULT_WORKER_LOSS_TIMEOUT_S,
    apply_to_worker,
    parse_loss_timeout,
    timeouts_warning,
)
from loadgen.runtime.stop_request import take_sigterm
from loadgen.runtime.verdict import EXIT_INCOMPLETE

log = logging.getLogger("loadgen")

class WorkerRuntime(RuntimeBase):
    """A worker: proves the join secret, loads its plan, drives its share from the master's go."""

    role = "worker"

    def __init__(self, environment: Any) -> None:
        super().__init__(environment)
        self._fetch: FileFetch | None = None  # pulling the master's streamed trace
        self._drained_runs: set[str] = set()  # runs that ended while this worker still pulled their trace
        self._parent_pid = 0
        self._denied_logged = False
        self._timeouts_checked = False

    def install(self) -> None:
        ev = self.env.events
        runner = self.env.runner
        # Locust has made its zmq socket (and with it zmq's I/O thread): those threads must not
        # take the core from the event loop while it reads (helper_threads.py).
        yield_helper_threads()
        ev.report_to_master.add_listener(self._on_report_to_master)
        ev.test_stop.add_listener(self._on_worker_test_stop)
        runner.register_message(MSG_PLAN, self._on_plan)
        runner.register_message(MSG_GO, self._on_go)
        runner.register_message(MSG_ADOPT, self._on_adopt)
        runner.register_message(MSG_DRAIN, self._on_drain, concurrent=True)
        runner.register_message(MSG_CHALLENGE, self._on_challenge)
        runner.register_message(MSG_DENIED, self._on_denied)
        runner.register_message(MSG_CLOCK, self._on_clock_ping)
        runner.register_message(MSG_FILE_CHUNK, self._on_file_chunk)
        # The master's challenge on connect may have come before these listeners: ask again.
        runner.send_message(MSG_HELLO, {})
        ev.quitting.add_listener(self._on_worker_quitting)
        # A worker forked by --processes dies with its master (a kill -9 of the master must
        # not leave it sending load that nobody records); it then drains and exits.
        from targets.fleet.procs import die_with_parent

        self._parent_pid = os.getppid()
        die_with_parent(signal.SIGTERM)
        from loadgen.runtime.master_watch import install_master_watch

        apply_to_worker(self.master_loss_timeout_s)
        install_master_watch(self.env, self._on_master_lost, self.master_loss_timeout_s)
        ev.test_start.add_listener(self._check_loss_timeouts)
        if getattr(runner, "worker_state", STATE_INIT) != STATE_INIT:
            # Locust's spawn (and its test_start) came before this listener: check now.
            self._check_loss_timeouts(self.env)
        # A worker forked by --processes inherits the master's --json-file: only the master
        # writes in the results directory (a worker's table would overwrite the master's).
        if getattr(self.env.parsed_options, "json_file", None):
            self.env.parsed_options.json_file = None

    def _on_plan(self, environment: Any, msg: Any, **_: Any) -> None:
        """Load the plan and measure the target; say so to the master (``MSG_READY``), and start
        when it says go. A plan that already has its start (a takeover mid-run) starts at once."""
        t_got = time.monotonic()
        t1w = worker_wall_time()
        take_sigterm(self._on_worker_sigterm)
        plan = Plan.from_wire(msg.data)
        if self.driver is not None and not self.driver.done.is_set():
            self.driver.drain(0)
        self.driver = None
        if needs_fetch(plan.config, plan.config.workload_pull_bytes):
            # Not inline: the chunks come as messages this handler would hold up.
            gevent.spawn(self._fetch_then_prepare, plan, msg.data, t_got, t1w)
            return
        self._prepare_and_report(plan, msg.data, t_got, t1w)

    def _fetch_then_prepare(self, plan: Plan, data: dict[str, Any], t_got: float, t1w: float) -> None:
        """Pull the master's trace into a temporary file (``loadgen.runtime.file_ship``), then prepare."""
        cfg = plan.config
        fetch = self._fetch = FileFetch(self.env.runner.send_message, cfg.run_id, cfg.workload, int(cfg.workload_pull_bytes or 0))
        try:
            path = fetch.run()
        except (UserError, OSError) as e:  # a refusal, or this host's disk (full /tmp)
            if cfg.run_id in self._drained_runs:
                return  # the run ended first: the final report was sent
            message = e.message if isinstance(e, UserError) else f"cannot store {cfg.workload} here ({e.strerror or e})"
            log.error("worker cannot run the plan: %s", message)
            self.env.runner.send_message(MSG_READY, {"run_id": cfg.run_id, "error": str(message)})
            return
        finally:
            if self._fetch is fetch:  # a later plan's pull is its own
                self._fetch = None
        log.warning(
            "%s is not on this host: pulled it from the master (%.1f MiB in %.1f s)",
            cfg.workload, fetch.size / 2**20, fetch.seconds,
        )  # fmt: skip
        if cfg.run_id in self._drained_runs:
            return
        plan.config = fetched_config(cfg, path)
        self._prepare_and_report(plan, data, t_got, t1w)

    def _on_file_chunk(self, environment: Any, msg: Any, **_: Any) -> None:
        if self._fetch is not None:
            self._fetch.on_chunk(msg.data or {})

    def _prepare_and_report(self, plan: Plan, data: dict[str, Any], t_got: float, t1w: float) -> None:
        try:
            self._prepare_driver(plan, worker_id=self.env.runner.client_id, skip_before_s=data.get("skip_before_s"))
        except Exception as e:
            log.error("worker cannot run the plan: %s", e)
            message = str(getattr(e, "message", None) or e)
            self.env.runner.send_message(MSG_READY, {"run_id": plan.config.run_id, "error": message})
            return
        assert self.driver is not None
        if plan.t0_unix_s:  # a takeover mid-run: the master measured this worker's clock when it joined
            self._start_driver(plan.t0_unix_s + float(data.get("clock_offset_s") or 0.0))
            return
        ready = {"run_id": plan.config.run_id, **self.driver.ready_info()}
        ready["prepare_s"] = round(time.monotonic() - t_got, 4)
        ready["t1w"] = t1w  # this worker's clock when the plan came, and when READY leaves
        ready["t2w"] = worker_wall_time()
        self.env.runner.send_message(MSG_READY, ready)

    def _on_go(self, environment: Any, msg: Any, **_: Any) -> None:
        data = msg.data or {}
        if self.plan is None or self.driver is None or data.get("run_id") != self.plan.config.run_id:
            return
        if not self.driver.t0_ns and not self.driver.stopping:
            self.plan.t0_unix_s = float(data["t0"])  # on the master's clock
            # On this worker's clock the run starts at t0 plus the offset the master measured.
            self._start_driver(self.plan.t0_unix_s + float(data.get("clock_offset_s") or 0.0))

    def _start_driver(self, t0_unix_s: float) -> None:
        assert self.driver is not None
        self._cpu_at_plan = time.process_time()
        self._wall_at_plan = time.monotonic()
        self.driver.start(t0_unix_s)
        gevent.spawn(self._worker_done_watch, self.driver)

    def _on_challenge(self, environment: Any, msg: Any, **_: Any) -> None:
        """Prove the join secret: HMAC-SHA256(secret, nonce || client id); the secret stays here."""
        nonce = str((msg.data or {}).get("nonce") or "")
        secret = os.environ.get(SECRET_ENV, "").strip() or None
        if secret is None:
            log.error("the master requires a join secret: give it in $%s or with --join-secret-file PATH", SECRET_ENV)
            self.env.runner.send_message(MSG_AUTH, {"mac": None})
            return
        try:
            mac = response(secret, nonce, self.env.runner.client_id)
        except ValueError:  # not a hex nonce
            mac = ""
        self.env.runner.send_message(MSG_AUTH, {"mac": mac})

    def _on_clock_ping(self, environment: Any, msg: Any, **_: Any) -> None:
        t1w = worker_wall_time()
        data = msg.data or {}
        self.env.runner.send_message(MSG_CLOCK, {"t0m": data.get("t0m"), "t1w": t1w, "t2w": worker_wall_time()})

    def _on_denied(self, environment: Any, msg: Any, **_: Any) -> None:
        if not self._denied_logged:
            self._denied_logged = True
            why = (msg.data or {}).get("why") if isinstance(msg.data, dict) else None
            message = (
                f"the master refused this worker: {why}"
                if why
                else "the master refused this worker (its join secret is missing or wrong); it gets no part of the run"
            )
            tell_user(logging.ERROR, message)

    def _on_adopt(self, environment: Any, msg: Any, **_: Any) -> None:
        """Part of a lost worker's arrivals: sent from ``from_s`` on, as if they were ours."""
        data = msg.data or {}
        d = self.driver
        if self.plan is None or d is None or data.get("run_id") != self.plan.config.run_id:
            return
        was_done = d.done.is_set()
        if d.adopt(int(data["slot"]), [list(x) for x in data.get("splits") or []], float(data["from_s"])):
            log.warning("adopting slot %s %s from %.1fs (a lost worker's)", data["slot"], data.get("splits"), data["from_s"])
            if was_done:
                self._done_sent = False
                gevent.spawn(self._worker_done_watch, d)

    def _on_report_to_master(self, client_id: str, data: dict[str, Any], **_: Any) -> None:
        if self.plan is not None:
            data["loadgen"] = self._worker_payload()

    def _on_drain(self, environment: Any, msg: Any, **_: Any) -> None:
        fetch = self._fetch
        if fetch is not None and msg.data.get("run_id") == fetch.run_id:
            # Still pulling the trace: it sent nothing and never will; say so, and start nothing.
            self._drained_runs.add(fetch.run_id)
            fetch.cancel()
            self._final_sent = True
            self.env.runner.send_message(MSG_FINAL, {**self._worker_payload(final=True), "run_id": fetch.run_id})
            return
        if self.plan is None or msg.data.get("run_id") != self.plan.config.run_id:
            return
        if self.driver is not None:
            self.driver.drain(float(msg.data.get("deadline_s", 30.0)))
        self._final_sent = True
        self.env.runner.send_message(MSG_FINAL, self._worker_payload(final=True))

    def _on_worker_sigterm(self) -> None:
        """SIGTERM to this worker: drain, send everything to the master, then quit."""
        self._on_worker_quitting(self.env)
        self.env.runner.quit()

    def _on_worker_quitting(self, environment: Any, **_: Any) -> None:
        """This worker is shutting down without the master's drain (a signal: SIGTERM to it or its
        group, its master gone): drain what is on the wire and send it all, then go."""
        if self.plan is None or self.driver is None or self._final_sent:
            return
        if not self.driver.done.is_set():
            # A forked worker whose master died (it got SIGTERM as it did) has nobody to drain for.
            deadline_s = 0.0 if os.getppid() != self._parent_pid else self.plan.config.stop_timeout_s
            log.info("stopping: draining the requests on the wire (up to %g s)", deadline_s)
            self.driver.drain(deadline_s)
        self._final_sent = True
        payload = self._worker_payload(final=True)
        payload["left"] = "stopped by a signal"
        self.env.runner.send_message(MSG_FINAL, payload)

    def _worker_done_watch(self, driver: Driver) -> None:
        driver.done.wait()
        if driver is self.driver and not driver.stopping and not self._done_sent:
            self._done_sent = True
            self.env.runner.send_message(MSG_DONE, self._worker_payload(final=True))

    def _check_loss_timeouts(self, environment: Any, **_: Any) -> None:
        """Once the master's options arrive (Locust's spawn message): warn if this worker would give
        up on its master before the master counts it lost (loadgen/runtime/loss_timeouts.py)."""
        if self._timeouts_checked:
            return
        self._timeouts_checked = True
        theirs = getattr(environment.parsed_options, "worker_loss_timeout", None)
        try:
            master_s = parse_loss_timeout("--worker-loss-timeout", theirs) if theirs else DEFAULT_WORKER_LOSS_TIMEOUT_S
        except UserError:
            return
        text = timeouts_warning(master_s, self.master_loss_timeout_s)
        if text:
            tell_user(logging.WARNING, text)

    def _on_master_lost(self, silent_s: float) -> None:
        if self.driver is None or self.driver.done.is_set():
            # No load to stop: the master may be busy ending the run (its summary of a long run
            # takes seconds); an idle worker whose master is gone is ended by Locust's own timeout.
            log.warning("no heartbeat from the master for %.0f s", silent_s)
            return
        # Nobody records what this worker sends any more: stop the load now, and exit.
        message = f"master lost: no heartbeat for {silent_s:.0f} s; this worker stopped its load and exits"
        tell_user(logging.ERROR, message)
        if self.driver is not None and not self.driver.done.is_set():
            self.driver.drain(0)
        self._final_sent = True  # nobody to send it to
        self.env.process_exit_code = EXIT_INCOMPLETE
        gevent.spawn(self.env.runner.quit)

    def _on_worker_test_stop(self, environment: Any, **_: Any) -> None:
        # The master's drain barrier normally ran first; this covers a stop without one.
        if self.driver is not None and not self.driver.done.is_set():
            self.driver.drain(0)
