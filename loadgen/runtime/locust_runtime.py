"""loadgen inside Locust: plans, metric exchange, drain barrier, results and verdict.

One ``LoadgenRuntime`` hangs off each Locust ``Environment`` (``environment.loadgen``), so a
master and workers can share one test process. Roles follow Locust's runner:

* **local** (no master/worker): drives, records and writes results in one process.
* **master**: at ``test_start`` sends every connected worker a plan (config, n, slot, t0); merges
  the workers' histogram deltas exactly (``decode_and_add``) and appends their records; writes
  ``results/<run>/``; at ``test_stopping`` runs the drain barrier (Locust itself waits only 0.5 s
  for final reports); at ``test_stop`` closes the results and computes the verdict. Workers lost
  mid-run (missed heartbeats) are named in run.json; a worker joining mid-run takes over a lost
  slot or stands by for one (docs/distributed.md).
* **worker**: runs its ``Driver`` for the plan it got; ships deltas with every Locust report and
  a final one when drained or done.

Everything attaches through events and ``register_message``; no runner is subclassed or patched.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import gevent
from gevent.event import Event
from locust.runners import STATE_INIT, STATE_MISSING, STATE_RUNNING, MasterRunner, WorkerRunner

from analysis.records import RUN_ABORTED, RUN_COMPLETE, RequestRecord
from analysis.slo import parse_slos
from loadgen.config import Plan, RunConfig
from loadgen.engine.driver import Driver, global_schedule
from loadgen.engine.health import SHIP_INTERVAL_S, GeneratorHealth
from loadgen.engine.health import summarize as summarize_health
from loadgen.engine.plan_stream import count_in_background
from loadgen.engine.recorder import Delta, MetricsAggregate, Recorder
from loadgen.engine.worker_clock import (
    CLOCK_GOOD_ERROR_S,
    CLOCK_PINGS,
    CLOCK_RECHECK_PINGS,
    CLOCK_RECHECK_S,
    CLOCK_REFINE_WAIT_S,
    DEFAULT_MAX_CLOCK_OFFSET_S,
    clock_offset_refusal,
    parse_max_clock_offset,
    worker_wall_time,
)
from loadgen.errors import UserError
from loadgen.live.progress import ProgressLine
from loadgen.live.snapshot import RunSnapshot
from loadgen.runtime.accounting import Accounting, Share
from loadgen.runtime.file_ship import (
    MSG_FILE_CHUNK,
    MSG_FILE_PULL,
    FileFetch,
    fetched_config,
    needs_fetch,
    read_chunk,
    shipped_size,
)
from loadgen.runtime.join_auth import (
    ALLOW_ENV,
    SECRET_ENV,
    UNAUTHENTICATED_WARNING,
    hostname_of,
    is_loopback,
    new_nonce,
    response,
    verify,
)
from loadgen.runtime.join_gate import JoinGate, install_join_gate
from loadgen.runtime.locust_options import check_session_count, config_from_options
from loadgen.runtime.loss_timeouts import (
    DEFAULT_MASTER_LOSS_TIMEOUT_S,
    DEFAULT_WORKER_LOSS_TIMEOUT_S,
    apply_to_master,
    apply_to_worker,
    parse_loss_timeout,
    timeouts_warning,
)
from loadgen.runtime.master_quit import install_prompt_quit
from loadgen.runtime.peer_address import PeerAddresses
from loadgen.runtime.results_writer import ResultsWriter
from loadgen.runtime.run_record import generator_cpu, run_info
from loadgen.runtime.run_workload import config_workload
from loadgen.runtime.stop_request import STOP_SIGNAL, take_sigterm
from loadgen.runtime.verdict import EXIT_INCOMPLETE, EXIT_USAGE, Verdict, decide_verdict
from targets.quiet_gc import quiet_gc

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
# A worker taking over a lost slot sends the slot's arrivals from this long after the takeover:
# its plan reaches it first, so none of them is sent late (late ones would count as schedule lag).
TAKEOVER_LEAD_S = 0.5
# A headless master whose join secret is required waits this long, at the test start, for
# --expect-workers workers that proved it (Locust's own wait counts any client that connected).
VERIFIED_WAIT_S = 60.0
# A worker whose clock is off the master's by more than this is named in run.json's warnings.
CLOCK_OFFSET_WARN_S = 0.010


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


class LoadgenRuntime:
    def __init__(self, environment: Any) -> None:
        self.env = environment
        runner = environment.runner
        if isinstance(runner, MasterRunner):
            self.role = "master"
        elif isinstance(runner, WorkerRunner):
            self.role = "worker"
        else:
            self.role = "local"
        # worker side
        self.recorder = Recorder()
        self.driver: Driver | None = None
        self.health: GeneratorHealth | None = None  # the worker's event-loop lag and receive delays
        self.plan: Plan | None = None
        self._done_sent = False
        # collector side (master/local)
        self.aggregate = MetricsAggregate()
        self.config: RunConfig | None = None
        self.writer: ResultsWriter | None = None
        self.t0_unix_s = 0.0
        self.t_end_unix_s: float | None = None  # when the run's results were closed
        self.slots: dict[str, int] = {}
        self.worker_state: dict[str, dict[str, Any]] = {}
        self.finals: set[str] = set()
        self.done_workers: set[str] = set()
        self.lost: dict[str, dict[str, Any]] = {}
        self.standby: list[str] = []  # connected during the run without a slot, in join order
        self._all_final = Event()
        self._greenlets: list[gevent.Greenlet] = []
        self._interval_start = 0.0
        self._cpu_at_plan = time.process_time()
        self._wall_at_plan = time.monotonic()
        self._stopping_requested = False
        self._quit_requested = False
        self._abort_reason = None
        self._planned_end = False
        self._draining = False
        self._drained = Event()
        self._preparing = False  # plans sent, the clock not started yet
        self._ready: dict[str, dict[str, Any]] = {}
        self._plan_sent_at: dict[str, float] = {}
        self._plan_sent_wall: dict[str, float] = {}  # master's wall clock when the plan left (t0m)
        self._deferred_replans: list[str] = []
        self.shares: dict[str, list[Share]] = {}  # the parts of the schedule each worker holds
        self._run_info_doc: dict[str, Any] = {}
        self.n_slots = 0
        self.accounting: Accounting | None = None
        self._count_greenlet: gevent.Greenlet | None = None  # a streamed trace counted during the run
        self._fetch: FileFetch | None = None  # a worker pulling the master's streamed trace
        self._drained_runs: set[str] = set()  # runs that ended while this worker still pulled their trace
        self._fingerprint_greenlet: gevent.Greenlet | None = None  # hashing a streamed trace
        self._workload: Any = None  # the run's workload on the master (its fingerprint, once hashed)
        self._final_sent = False
        self._parent_pid = 0
        self.verdict: Verdict | None = None
        self._verdict_printed = False
        self.progress: ProgressLine | None = None
        self.last_run_dir: Path | None = None
        self.live_view: Any = None
        self.endpoint: Any = None  # the Prometheus /metrics endpoint, with --prometheus-port
        # joining (master): the secret workers must prove; who proved it (True) or was let in
        # without one (False); the challenges outstanding; the ids already logged as ignored
        self.join_secret: str | None = os.environ.get(SECRET_ENV, "").strip() or None
        self.allow_unauthenticated = os.environ.get(ALLOW_ENV) == "1"
        self.verified: dict[str, bool] = {}
        self._challenges: dict[str, str] = {}
        self._ignored_logged: set[str] = set()
        self._refused: set[str] = set()  # answered wrong: no second try for that client id
        self._clock: dict[str, dict[str, float]] = {}  # offsets of workers that joined mid-run
        self._clock_pings: dict[str, int] = {}
        self._denied_logged = False
        # heartbeat timeouts (loadgen/runtime/loss_timeouts.py): the master's wait for a silent worker,
        # a worker's for its silent master
        self.worker_loss_timeout_s = self._loss_timeout("worker_loss_timeout", DEFAULT_WORKER_LOSS_TIMEOUT_S)
        self.master_loss_timeout_s = self._loss_timeout("master_loss_timeout", DEFAULT_MASTER_LOSS_TIMEOUT_S)
        self._timeouts_checked = False
        self.max_clock_offset_s, self.allow_clock_offset = self._clock_bound()
        self._recheck: dict[str, dict[str, Any]] = {}  # a slot holder's clock re-measured mid-run
        self._drift_warned: set[str] = set()
        self.join_gate: JoinGate | None = None  # Locust's own messages wait for the join secret too
        self.peers: PeerAddresses | None = None  # the address each worker's messages come from

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

    # ================================================================ installation
    def install(self) -> None:
        ev = self.env.events
        runner = self.env.runner
        if self.role in ("master", "local"):
            ev.test_start.add_listener(self._on_test_start)
            ev.test_stopping.add_listener(self._on_test_stopping)
            ev.test_stop.add_listener(self._on_test_stop)
            ev.quitting.add_listener(self._on_quitting)
            ev.quit.add_listener(self._on_quit)
            ev.reset_stats.add_listener(self._on_reset_stats)
        if self.role in ("master", "local") and getattr(self.env, "web_ui", None) is not None:
            from loadgen.live.webui import install_web_ui

            self.live_view = install_web_ui(self.env, self.snapshot)
        if self.role in ("master", "local"):
            from loadgen.live.metrics_endpoint import install_endpoint

            self.endpoint = install_endpoint(self.env, self.snapshot)
        if self.role == "master":
            apply_to_master(self.worker_loss_timeout_s)
            # Locust's spawn copies the master's own options into each worker's: without this, the
            # master's default --master-loss-timeout would replace a worker's own setting there.
            if getattr(self.env, "parsed_options", None) is not None:
                vars(self.env.parsed_options).pop("master_loss_timeout", None)
            if self.join_secret is not None:
                # Before any message is handled: Locust's spawn goes only to clients that proved it.
                self.join_gate = install_join_gate(runner, self.accepted)
                ev.quitting.add_listener(lambda **_: self.join_gate and self.join_gate.quit_held())
            self.peers = PeerAddresses(runner).install()
            install_prompt_quit(runner)
            gevent.signal_handler(STOP_SIGNAL, self._on_stop_request)
            ev.worker_report.add_listener(self._on_worker_report)
            ev.worker_connect.add_listener(self._on_worker_connect)
            runner.register_message(MSG_FINAL, self._on_final)
            runner.register_message(MSG_DONE, self._on_done)
            runner.register_message(MSG_READY, self._on_ready)
            runner.register_message(MSG_AUTH, self._on_auth)
            runner.register_message(MSG_HELLO, self._on_hello)
            runner.register_message(MSG_CLOCK, self._on_clock)
            runner.register_message(MSG_FILE_PULL, self._on_file_pull)
            if self._headless():
                self._await_workers()  # after the listeners: proving the join secret takes messages
        if self.role == "worker":
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

    # ================================================================ master / local
    def _on_test_start(self, environment: Any, **_: Any) -> None:
        take_sigterm(self._on_sigterm)
        if self.role == "master":
            gevent.spawn(self._begin_after_spawn, environment)
        else:
            self._begin_run(environment)

    def _begin_after_spawn(self, environment: Any) -> None:
        """Start the run once every worker has handled Locust's spawn message.

        Locust sends it right after ``test_start``, and a worker spends ~0.3-0.7 s of CPU on it
        (it rebuilds its argument parser once per option). A plan that arrived first would see its
        first arrivals late by that much: schedule lag the generator did not owe to the load.
        """
        if self.join_secret is not None and self._headless():
            self._await_verified(VERIFIED_WAIT_S)
        deadline = time.monotonic() + SPAWN_WAIT_S
        while time.monotonic() < deadline:
            nodes = [c for c in self.env.runner.clients.values() if c.state != STATE_MISSING and self.accepted(c.id)]
            if nodes and all(c.state == STATE_RUNNING for c in nodes):
                break
            gevent.sleep(0.005)
        self._begin_run(environment)

    def _await_workers(self) -> None:
        """Headless master: wait (briefly) here, in ``init``, for the expected workers.

        Locust's headless start checks for them once and then sleeps a whole second before it
        looks again; forked workers connect within tens of milliseconds, so finding them on its
        first look saves most of that second on every run.
        """
        self._await_verified(SPAWN_WAIT_S)

    def _await_verified(self, wait_s: float) -> None:
        """Wait up to ``wait_s`` for --expect-workers connected workers this master accepts."""
        expected = int(getattr(self.env.parsed_options, "expect_workers", 1) or 1)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and not self._stopping_requested:
            if len(self._accepted_workers()) >= expected:
                return
            gevent.sleep(0.005)
        if self.join_secret is not None and wait_s >= VERIFIED_WAIT_S:
            log.warning(
                "%d of %d expected workers proved the join secret within %.0f s; the run starts with them",
                len(self._accepted_workers()), expected, wait_s,
            )  # fmt: skip

    def accepted(self, client_id: str) -> bool:
        """May this client take part? Without a join secret, any; with one, those that proved it."""
        return self.join_secret is None or client_id in self.verified

    def _accepted_workers(self) -> list[str]:
        clients = self.env.runner.clients.values()
        return sorted(c.id for c in clients if c.state != STATE_MISSING and self.accepted(c.id))

    def _ignored(self, client_id: str) -> bool:
        """A message from a client that did not prove the join secret: drop it (logged once)."""
        if self.accepted(client_id):
            return False
        if client_id not in self._ignored_logged:
            self._ignored_logged.add(client_id)
            log.warning("unauthenticated worker %s from %s ignored", client_id, self._origin(client_id))
        return True

    def _begin_run(self, environment: Any) -> None:
        try:
            # Off the loop: it opens the workload (a large file's first rows), heartbeats go on.
            cfg = off_the_loop(config_from_options, environment.parsed_options)
            if self.config is not None and self.config.run_id == cfg.run_id:
                # The web UI can start a second test in one process: never overwrite a run.
                cfg.run_id = f"{cfg.run_id}-{int(time.time())}"
            self._start_run(cfg)
        except UserError as e:
            self._fatal(str(e.message), 2)
        except OSError as e:  # the results directory, checked before load but changed since
            self._fatal(f"--results {environment.parsed_options.results}: cannot write there ({e.strerror or e})", 2)

    def _start_run(self, cfg: RunConfig) -> None:
        """Validate, plan the arrivals, hand every worker its plan; the clock starts in ``_go``
        once every worker has loaded it and measured the target's connection set-up."""
        self._reset_collector()
        self.config = cfg
        slos = parse_slos(cfg.slos)
        self.aggregate = MetricsAggregate(slos.request_meets if slos.per_request else None)
        workload = off_the_loop(config_workload, cfg)  # validate before any load is sent
        schedule = None if cfg.concurrency else off_the_loop(global_schedule, cfg, workload)
        if schedule is not None:
            check_session_count(cfg.num_sessions, schedule.available, "the trace" if cfg.arrival == "trace" else "the workload")
        # Off the loop: a closed loop over a streamed trace counts its rows.
        self.accounting = off_the_loop(Accounting.plan, cfg, schedule, workload)
        if self.role == "master":
            cfg.workload_pull_bytes = shipped_size(cfg)  # a worker without the file pulls it
        self._count_greenlet = count_in_background(schedule, self.accounting, self._stop_on_bad_trace)
        self.t0_unix_s = 0.0
        self.t_end_unix_s = None
        self.last_run_dir = Path(cfg.results_dir) / cfg.run_id
        self._preparing = True
        if self.role == "local":
            self._run_info_doc = self._run_info(cfg)
            self._workload = workload
            self.n_slots = 1
            self._prepare_driver(Plan(cfg, 1, 0, 0.0), worker_id="local")
            self._go(time.time() + START_LEAD_LOCAL_S)
            return
        workers = self._accepted_workers()
        if not workers:
            if self.join_secret is not None:
                raise UserError(
                    "no worker proved the join secret; start workers with 'loadgen worker --master-host HOST' "
                    f"and the same secret (${SECRET_ENV} or --join-secret-file)"
                )
            raise UserError("no workers connected; start workers with 'loadgen worker --master-host HOST'")
        self.n_slots = len(workers)
        self.accounting.n_slots = self.n_slots
        for slot, wid in enumerate(workers):
            self.slots[wid] = slot
            self.shares[wid] = [Share(slot)]
            self._log_join(wid, f"holds slot {slot}")
            self._plan_sent_at[wid] = time.monotonic()
            self._plan_sent_wall[wid] = time.time()
            self.env.runner.send_message(MSG_PLAN, Plan(cfg, len(workers), slot, 0.0).to_wire(), client_id=wid)
        self._run_info_doc = self._run_info(cfg)
        self._workload = workload
        self._greenlets = [gevent.spawn(self._start_when_ready), gevent.spawn(self._watch_workers)]

    def _start_when_ready(self) -> None:
        """Start the clock once every slot holder is ready (or lost, or late past READY_WAIT_S)."""
        deadline = time.monotonic() + READY_WAIT_S
        pending: list[str] = []
        while not self._stopping_requested:
            pending = [w for w in self.slots if w not in self._ready and not self._out_of_run(w)]
            if not pending or time.monotonic() > deadline:
                break
            gevent.sleep(0.005)
        if self._stopping_requested:
            return
        for wid in pending:
            log.error("worker %s did not load its plan within %.0f s; the run starts without it", wid, READY_WAIT_S)
            self._mark_lost(wid, why=f"not ready within {READY_WAIT_S:.0f} s")
        if not self._expected_finals():
            self._abort_reason = "no worker could load the plan"
            self._preparing = False
            self._fatal("run incomplete: no worker could load the plan", EXIT_INCOMPLETE)
            return
        self._refine_clocks()
        if self._refuse_off_clocks():
            return
        rtts = [r["rtt_s"] for r in self._ready.values() if r.get("rtt_s") is not None]
        lead = max(START_LEAD_LOCAL_S, 3 * max(rtts, default=0.0))
        self._go(time.time() + lead)

    def _clock_refusal(self, wid: str, r: dict[str, Any]) -> str | None:
        if r.get("clock_offset_s") is None:
            return None
        return clock_offset_refusal(
            wid, float(r["clock_offset_s"]), float(r.get("clock_offset_error_s") or 0.0), self.max_clock_offset_s
        )

    def _refuse_off_clocks(self) -> bool:
        """Before load: a worker whose clock is off by more than --max-clock-offset ends the run
        (exit 2, one line naming it), unless --allow-clock-offset accepts it (then recorded)."""
        for wid in sorted(self._ready):
            text = self._clock_refusal(wid, self._ready[wid])
            if text is None:
                continue
            if not self.allow_clock_offset:
                self._abort_reason = text
                self._preparing = False
                self._fatal(text, EXIT_USAGE)
                return True
            self._run_info_doc.setdefault("warnings", []).append(
                f"worker {wid}'s clock offset accepted with --allow-clock-offset: {text.split(': sync')[0]}"
            )
        return False

    def _recheck_clocks(self) -> None:
        """During the run, every CLOCK_RECHECK_S: each slot holder's clock measured again (a few
        pings, the least-error one kept), its drift from the offset it was anchored on recorded."""
        while True:
            gevent.sleep(CLOCK_RECHECK_S)
            for wid in list(self.slots):
                if wid in self._ready and not self._out_of_run(wid) and wid not in self._recheck:
                    self._recheck[wid] = {"pings": 0, "best": None}
                    self._ping(wid)

    def _take_recheck(self, wid: str, clock: dict[str, float]) -> None:
        round_ = self._recheck[wid]
        round_["pings"] += 1
        if round_["best"] is None or clock["clock_offset_error_s"] < round_["best"]["clock_offset_error_s"]:
            round_["best"] = clock
        best = round_["best"]
        if best["clock_offset_error_s"] > CLOCK_GOOD_ERROR_S and round_["pings"] < CLOCK_RECHECK_PINGS:
            gevent.spawn_later(0.02, self._ping, wid)
            return
        del self._recheck[wid]
        info = self._ready.get(wid)
        if info is None or info.get("clock_offset_s") is None:
            return
        drift_s = round(best["clock_offset_s"] - float(info["clock_offset_s"]), 6)
        info["clock_rechecks"] = int(info.get("clock_rechecks") or 0) + 1
        if abs(drift_s) >= abs(float(info.get("clock_drift_s") or 0.0)):
            info["clock_drift_s"] = drift_s
        error_s = best["clock_offset_error_s"] + float(info.get("clock_offset_error_s") or 0.0)
        if abs(drift_s) - error_s > self.max_clock_offset_s and wid not in self._drift_warned and self.writer is not None:
            self._drift_warned.add(wid)
            text = (
                f"worker {wid}'s clock drifted {drift_s * 1000:+.1f} ms (+/- {error_s * 1000:.1f} ms) during the run, "
                f"over --max-clock-offset {self.max_clock_offset_s * 1000:g}ms: its later arrivals are off by about that"
            )
            log.warning("%s", text)
            self.writer.run_info.setdefault("warnings", []).append(text)

    def _refine_clocks(self) -> None:
        """Wait (at most CLOCK_REFINE_WAIT_S) for the pings that refine the READY clock samples,
        then anchor each worker on its best sample."""
        deadline = time.monotonic() + CLOCK_REFINE_WAIT_S

        def measuring(wid: str) -> bool:
            best = self._clock.get(wid)
            return (
                best is not None
                and best["clock_offset_error_s"] > CLOCK_GOOD_ERROR_S
                and self._clock_pings.get(wid, CLOCK_PINGS) < CLOCK_PINGS
            )

        while any(measuring(w) for w in self._ready) and time.monotonic() < deadline and not self._stopping_requested:
            gevent.sleep(0.005)
        for wid, info in self._ready.items():
            best = self._clock.get(wid)
            if best is not None and "clock_offset_error_s" in info:
                info.update(best, clock_samples=1 + self._clock_pings.get(wid, 0))

    def _go(self, t0_unix_s: float) -> None:
        """The run's clock starts at ``t0_unix_s``: results open, workers are told, timers start."""
        cfg = self.config
        assert cfg is not None
        self._preparing = False
        self.t0_unix_s = t0_unix_s
        self._interval_start = t0_unix_s
        if self.live_view is not None:
            self.live_view.start_over()
        if self.endpoint is not None:
            self.endpoint.invalidate()
        run_dir = Path(cfg.results_dir) / cfg.run_id
        if self.role == "master":
            self._warn_clock_offsets()
        self.writer = ResultsWriter(run_dir, self._run_info_doc, t0_unix_s)
        # After the start, not before: hashing a large trace would hold up the workers' set-up.
        self._fingerprint_greenlet = gevent.spawn(self._fill_fingerprint, self._workload)
        log.info("loadgen run %s: results in %s", cfg.run_id, run_dir)
        if self.role == "local":
            assert self.driver is not None
            self._cpu_at_plan = time.process_time()
            self._wall_at_plan = time.monotonic()
            self.driver.start(t0_unix_s)
            self._greenlets.append(gevent.spawn(self._local_done_watch, self.driver))
        else:
            for wid in self._expected_finals():
                offset = float(self._ready.get(wid, {}).get("clock_offset_s") or 0.0)
                go = {"run_id": cfg.run_id, "t0": t0_unix_s, "clock_offset_s": offset}
                self.env.runner.send_message(MSG_GO, go, client_id=wid)
            self._write_lost()
            for wid in self._deferred_replans:
                self._replan(wid)
            self._deferred_replans = []
        if self.accounting is not None:
            self.writer.update_run(accounting=self.accounting.as_dict())
        self.progress = ProgressLine(cfg, t0_unix_s, self.aggregate, self._in_flight_summary)
        self._greenlets.append(gevent.spawn(self._flush_loop))
        if self.role == "master":
            self._greenlets.append(gevent.spawn(self._recheck_clocks))
        if cfg.duration_s is not None:
            self._greenlets.append(gevent.spawn(self._stop_after, cfg.duration_s))
        if self.role == "master":
            from loadgen.runtime.master_gc import collect_periodically, freeze_startup_heap

            freeze_startup_heap()
            self._greenlets.append(gevent.spawn(collect_periodically))

    def _warn_clock_offsets(self) -> None:
        """Name each worker whose wall clock is off the master's by more than CLOCK_OFFSET_WARN_S
        (its arrivals are anchored for the measured offset; the warning says the host's clock is off)."""
        for wid in sorted(self._ready):
            text = self._clock_warning(wid, self._ready[wid])
            if text:
                log.warning("%s", text)
                self._run_info_doc.setdefault("warnings", []).append(text)

    @staticmethod
    def _clock_warning(wid: str, r: dict[str, Any]) -> str | None:
        offset = r.get("clock_offset_s")
        if offset is None or abs(offset) <= CLOCK_OFFSET_WARN_S:
            return None
        return (
            f"worker {wid}'s clock is {offset * 1000:+.1f} ms off the master's "
            f"(+/- {float(r.get('clock_offset_error_s') or 0.0) * 1000:.1f} ms); its arrivals were anchored for it"
        )

    def _run_info(self, cfg: RunConfig) -> dict[str, Any]:
        info_file = getattr(self.env.parsed_options, "target_info", "") or ""
        doc = run_info(cfg, role=self.role, target_info_file=info_file)
        if self.role == "master":
            unauthenticated = self.join_secret is None and self.allow_unauthenticated
            doc["worker_auth"] = {
                "join_secret_required": self.join_secret is not None,
                "allow_unauthenticated_workers": unauthenticated,
            }
            if unauthenticated:
                doc.setdefault("warnings", []).append(UNAUTHENTICATED_WARNING)
        return doc

    def _prepare_driver(self, plan: Plan, worker_id: str, skip_before_s: float | None = None) -> None:
        """Load the plan's workload and build its driver (schedule, connection set-up measured);
        it starts with ``driver.start`` when the run's clock does."""
        cfg = plan.config
        api_key = os.environ.get(cfg.api_key_env) if cfg.api_key_env else None
        workload = off_the_loop(config_workload, cfg)  # the master's file content if the path is not here
        schedule = None if cfg.concurrency else off_the_loop(lambda: global_schedule(cfg, workload, count=False))
        self.recorder = Recorder()
        self.plan = plan
        self._done_sent = False
        self._final_sent = False
        quiet_gc()
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

    def _local_done_watch(self, driver: Driver) -> None:
        driver.done.wait()
        if driver is self.driver and not driver.stopping:
            log.info("all sessions finished")
            self._planned_end = True
            self._request_stop()

    def _stop_after(self, duration_s: float) -> None:
        gevent.sleep(max(0.0, self.t0_unix_s + duration_s - time.time()))
        log.info("duration reached, stopping arrivals")
        self._planned_end = True
        self._request_stop()

    def _request_stop(self) -> None:
        if self._stopping_requested:
            return
        self._stopping_requested = True
        runner = self.env.runner
        self._quit_requested = self._headless()
        # Outside the caller's greenlet: quit() kills greenlets, possibly the caller's own.
        gevent.spawn(runner.quit if self._quit_requested else runner.stop)

    def _on_stop_request(self) -> None:
        """The front's stop (``loadgen.runtime.stop_request``): quit the runner as a run that reached its
        end does, then the web UI if there is one (the process ends when it stops serving)."""
        if not self._quit_requested:
            self._quit_requested = self._stopping_requested = True
            gevent.spawn(self._quit_and_stop_serving)

    def _on_sigterm(self) -> None:
        """SIGTERM to this process (or its group): the run stops as on the front's stop request,
        draining what is on the wire, and says it was stopped by a signal."""
        if self.writer is not None and not self._planned_end and not self._abort_reason and not self._stopping_requested:
            self._abort_reason = (
                f"stopped by a signal (SIGTERM) after {time.time() - self.t0_unix_s:.1f} s, before its planned end"
            )
        self._on_stop_request()

    def _quit_and_stop_serving(self) -> None:
        self.env.runner.quit()
        web_ui = getattr(self.env, "web_ui", None)
        if web_ui is not None:
            web_ui.stop()

    def _headless(self) -> bool:
        return bool(getattr(self.env.parsed_options, "headless", False))

    def _fatal(self, message: str, code: int) -> None:
        log.error("%s", message)
        print(f"Error: {message}", file=sys.stderr, flush=True)
        self.env.process_exit_code = code
        self.verdict = Verdict(code, message)
        gevent.spawn(self.env.runner.quit)

    def _flush_loop(self) -> None:
        assert self.config is not None
        while True:
            gevent.sleep(self.config.report_interval_s)
            self._collect()
            self._stop_if_unwritable()
            if self.live_view is not None:
                self.live_view.record_history_point()
            if self.progress is not None:
                self.progress.tick()

    def _collect(self) -> None:
        """Merge what arrived since the last call and write it: one hlog interval, flushed records."""
        if self.writer is None:
            return
        if self.role == "local":
            records = self.aggregate.merge_local(*self.recorder.take())
            self.writer.append_records(records)
            if self.accounting is not None:
                self.accounting.count(records)
        now = time.time()
        self.writer.write_intervals(self.aggregate.take_interval(), self._interval_start, now)
        self._interval_start = now
        self.writer.flush()

    def _merge(self, delta: Delta) -> None:
        records = self.aggregate.merge(delta)
        if self.writer is not None and records:
            self.writer.append_records(records)
            if self.accounting is not None:
                self.accounting.count(records)
            self.writer.flush_records()  # on disk now: a kill of the master loses nothing received
            self._stop_if_unwritable()

    def _stop_if_unwritable(self) -> None:
        """Results that can no longer be written (disk full, read-only) stop the run: load that
        nobody records is wasted on the target. What reached the disk stays readable."""
        failed = self.writer.failed if self.writer is not None else None
        if failed is None or self._abort_reason == failed:
            return
        self._abort_reason = failed
        log.error("%s; stopping the run", failed)
        print(f"Error: {failed}; stopping the run", file=sys.stderr, flush=True)
        self._request_stop()

    def snapshot(self) -> RunSnapshot:
        """What the live views show of the current run (``loadgen.live.snapshot``)."""
        started, sessions, requests = self._in_flight_summary()
        if self.role == "master":
            workers = {
                "active": sum(1 for w in self.slots if not self._out_of_run(w)),
                "lost": sum(1 for w in self.lost if self._out_of_run(w)),
                "standby": len(self.standby),
            }
        else:
            workers = {"active": 1} if self.driver is not None else {}
        return RunSnapshot(
            config=self.config,
            aggregate=self.aggregate,
            t0_unix_s=self.t0_unix_s,
            t_end_unix_s=self.t_end_unix_s,
            sessions_started=started,
            sessions_in_flight=sessions,
            requests_in_flight=requests,
            workers=workers,
        )

    def _in_flight_summary(self) -> tuple[int, int, int]:
        """(sessions started, sessions in flight, requests in flight) over all workers."""
        if self.role == "local":
            d = self.driver
            return (d.sessions_started, len(d.in_flight.sessions), d.in_flight.requests) if d else (0, 0, 0)
        started = sum(s.get("started", 0) for s in self.worker_state.values())
        # A lost worker's last state is not in flight any more: it is lost (run.json names it).
        alive = [s for wid, s in self.worker_state.items() if not self._out_of_run(wid)]
        sessions = sum(len(s.get("sessions", ())) for s in alive)
        requests = sum(s.get("requests", 0) for s in alive)
        return started, sessions, requests

    # ---------------------------------------------------------------- master messages
    def _on_worker_report(self, client_id: str, data: dict[str, Any], **_: Any) -> None:
        payload = data.get("loadgen")
        if payload is None or self._ignored(client_id) or self.writer is None:
            return
        if payload.get("run_id") != (self.config.run_id if self.config else None):
            return
        if self._out_of_run(client_id) and not self._readmit(client_id, payload):
            return
        self._merge(Delta.from_wire(payload))
        self.worker_state[client_id] = payload.get("state", {})

    def _out_of_run(self, wid: str) -> bool:
        """Lost and not back (or back, then lost again): its slot's remaining work is not expected from it."""
        info = self.lost.get(wid)
        return info is not None and ("returned_at_s" not in info or "lost_again_at_s" in info)

    def _readmit(self, wid: str, payload: dict[str, Any]) -> bool:
        """A lost worker reports again (it was frozen, or its network came back): merge it or not.

        Its records are its own sessions', each shipped once, so merging them counts nothing
        twice, and it goes on with its slot. Unless another worker took the slot over, its
        arrivals were re-planned onto the others, or the run stops on a loss: then two workers
        would send the same sessions, so its reports are rejected (counted in run.json) and it is
        told to stop.
        """
        info = self.lost[wid]
        if "heard_again_at_s" not in info:
            # Its first message since the loss (a partition healed, a pause ended): kept beside
            # lost_at_s, whatever becomes of its reports.
            info["heard_again_at_s"] = round(time.time() - self.t0_unix_s, 3)
        taken = info.get("replaced_by") or info.get("replanned_onto") or "lost_again_at_s" in info
        if taken or (self.config is not None and self.config.on_worker_loss == "abort"):
            rejected = len(payload.get("r") or [])
            if rejected or "late_records_rejected" not in info:
                info["late_records_rejected"] = info.get("late_records_rejected", 0) + rejected
                self._write_lost()
            if not info.get("told_to_stop") and self.config is not None:
                info["told_to_stop"] = True
                self.env.runner.send_message(MSG_DRAIN, {"deadline_s": 0, "run_id": self.config.run_id}, wid)
            return False
        info["returned_at_s"] = round(time.time() - self.t0_unix_s, 3)
        info["pid"] = info.get("pid") or (payload.get("state") or {}).get("pid")  # lost before its first report
        # Locust clears STATE_MISSING only at the worker's next heartbeat, up to a second after
        # this report: until then the watch (every 0.25 s) would take it for lost a second time,
        # for good. Its report is word from it, as a heartbeat is.
        import locust.runners

        node = self.env.runner.clients.get(wid)
        if node is not None and node.state == STATE_MISSING:
            node.heartbeat = locust.runners.HEARTBEAT_LIVENESS
            node.state = STATE_RUNNING
        log.warning("lost worker %s (slot %s) reports again; its records are merged", wid, info["slot"])
        self._write_lost()
        return True

    def _on_final(self, environment: Any, msg: Any, **_: Any) -> None:
        if self._ignored(msg.node_id):
            return
        self._on_worker_report(msg.node_id, {"loadgen": msg.data})
        left = msg.data.get("left")
        if left and not self._draining and msg.node_id in self.slots and not self._out_of_run(msg.node_id):
            # Not asked for: the worker was stopped on its own (a signal). Everything it sent is
            # recorded; its arrivals not yet due go to the others.
            self._mark_lost(msg.node_id, why=left, left=True)
        self.finals.add(msg.node_id)
        if self._expected_finals() <= self.finals:
            self._all_final.set()

    def _on_file_pull(self, environment: Any, msg: Any, **_: Any) -> None:
        """A worker without the run's streamed trace pulls a chunk of it (``loadgen.runtime.file_ship``)."""
        data = msg.data or {}
        cfg = self.config
        if self._ignored(msg.node_id) or cfg is None or not cfg.workload_pull_bytes or data.get("run_id") != cfg.run_id:
            return
        chunk = read_chunk(cfg.workload, int(data.get("offset") or 0))
        self.env.runner.send_message(
            MSG_FILE_CHUNK, {"run_id": cfg.run_id, "offset": data.get("offset"), "data": chunk}, client_id=msg.node_id
        )

    def _on_ready(self, environment: Any, msg: Any, **_: Any) -> None:
        """A worker holds its plan: note its set-up figures and the message round trip."""
        t3m = time.time()
        data = msg.data or {}
        wid = msg.node_id
        if self._ignored(wid):
            return
        if self.config is None or data.get("run_id") != self.config.run_id or wid not in self.slots:
            return
        if data.get("error"):
            self._mark_lost(wid, why=f"cannot run the plan: {data['error']}")
            return
        sent = self._plan_sent_at.get(wid)
        info = {k: data.get(k) for k in ("prepare_s", "connect_s", "session_lead_ms")}
        if sent is not None:
            info["rtt_s"] = round(max(0.0, time.monotonic() - sent - float(data.get("prepare_s") or 0.0)), 6)
        t0m, t1w, t2w = self._plan_sent_wall.get(wid), data.get("t1w"), data.get("t2w")
        if t0m is not None and t1w is not None and t2w is not None:
            # NTP's four stamps: the worker's clock minus the master's, to within half the round trip.
            info["clock_offset_s"] = round(((t1w - t0m) + (t2w - t3m)) / 2, 6)
            info["clock_offset_error_s"] = round(max(0.0, (t3m - t0m) - (t2w - t1w)) / 2, 6)
            # The READY answer is the first sample; pings refine it before the start (_on_clock).
            self._clock[wid] = {k: info[k] for k in ("clock_offset_s", "clock_offset_error_s")}
            self._clock_pings[wid] = 0
            if info["clock_offset_error_s"] > CLOCK_GOOD_ERROR_S:
                self._ping(wid)
        self._ready[wid] = info

    def _on_done(self, environment: Any, msg: Any, **_: Any) -> None:
        if self._ignored(msg.node_id):
            return
        self._on_worker_report(msg.node_id, {"loadgen": msg.data})
        self.done_workers.add(msg.node_id)
        self._stop_if_all_done()

    def _stop_if_all_done(self) -> None:
        """The run's planned end: every worker still holding a slot ran all its sessions.

        Checked when a worker reports done and when one is lost: the others may have finished
        before the loss was noticed (--worker-loss-timeout), and nothing else would end the run.
        """
        alive = self._expected_finals()
        if alive and alive <= self.done_workers and not self._stopping_requested:
            log.info("all workers finished their sessions")
            self._planned_end = True
            self._request_stop()

    def _expected_finals(self) -> set[str]:
        return {w for w in self.slots if not self._out_of_run(w)}

    def _on_worker_connect(self, client_id: str, **_: Any) -> None:
        """A worker connects: challenge it when a join secret is required, else let it join."""
        if self.join_secret is not None:
            if client_id not in self.verified and client_id not in self._refused:
                self._challenge(client_id)
            return
        if client_id not in self.verified:
            self.verified[client_id] = False
            self._log_join(client_id, "joined (no join secret required)")
        self._join_during_run(client_id)

    def _challenge(self, client_id: str) -> None:
        nonce = self._challenges.setdefault(client_id, new_nonce())
        self.env.runner.send_message(MSG_CHALLENGE, {"nonce": nonce}, client_id=client_id)

    def _on_hello(self, environment: Any, msg: Any, **_: Any) -> None:
        """The worker listens now (``worker_connect`` comes before): challenge it, or, if it is
        in, measure its clock when it joins a run under way."""
        wid = msg.node_id
        if self.join_secret is not None and wid not in self.verified:
            if wid not in self._refused:
                self._challenge(wid)
        elif self.accepted(wid):
            self._join_during_run(wid)

    def _on_auth(self, environment: Any, msg: Any, **_: Any) -> None:
        """A worker's answer to the challenge: it joins if it proved the secret."""
        wid = msg.node_id
        if self.join_secret is None or wid in self.verified or wid in self._refused:
            return
        nonce = self._challenges.pop(wid, None)
        answer = (msg.data or {}).get("mac")
        if nonce is None or not verify(self.join_secret, nonce, wid, answer):
            why = "no join secret" if answer is None else "a wrong join secret"
            log.warning("worker %s from %s refused: it answered with %s", wid, self._origin(wid), why)
            self._refused.add(wid)
            self.env.runner.send_message(MSG_DENIED, {}, client_id=wid)
            return
        self.verified[wid] = True
        self._log_join(wid, "joined (proved the join secret)")
        if self.join_gate is not None:
            self.join_gate.admit(wid)  # Locust lists it now (and, mid-run, sends it its spawn)
        self._join_during_run(wid)

    def _log_join(self, wid: str, what: str) -> None:
        # Shown by default (warning level) when other machines can reach the master's port.
        bind = str(getattr(self.env.parsed_options, "master_bind_host", "*") or "*")
        level = logging.INFO if is_loopback(bind) else logging.WARNING
        log.log(level, "worker %s (%s) %s", wid, self._where(wid), what)

    def _address(self, wid: str) -> str | None:
        return self.peers.address(wid) if self.peers is not None else None

    def _origin(self, wid: str) -> str:
        """Where a client's messages come from: its connection's address, else the host it claims."""
        return self._address(wid) or hostname_of(wid)

    def _where(self, wid: str) -> str:
        """``host H, address A``: the host the worker claims, and the address it really speaks from."""
        address = self._address(wid)
        return f"host {hostname_of(wid)}" + (f", address {address}" if address else "")

    def _join_during_run(self, client_id: str) -> None:
        """A worker joining during a run: measure its clock first (``_on_clock``), then place it."""
        if self.config is None or self.writer is None or self._stopping_requested:
            return
        if client_id in self.slots or client_id in self.standby:  # Locust repeats client_ready after a stop
            return
        self._ping(client_id)

    def _ping(self, client_id: str) -> None:
        self.env.runner.send_message(MSG_CLOCK, {"t0m": time.time()}, client_id=client_id)

    def _on_clock(self, environment: Any, msg: Any, **_: Any) -> None:
        """A newcomer's clock stamps: its offset, as in the READY/GO handshake; then it is placed."""
        t3m = time.time()
        wid, data = msg.node_id, msg.data or {}
        if self._ignored(wid):
            return
        try:
            t0m, t1w, t2w = float(data["t0m"]), float(data["t1w"]), float(data["t2w"])
        except (KeyError, TypeError, ValueError):
            return
        clock = {
            "clock_offset_s": round(((t1w - t0m) + (t2w - t3m)) / 2, 6),
            "clock_offset_error_s": round(max(0.0, (t3m - t0m) - (t2w - t1w)) / 2, 6),
        }
        if wid in self._recheck:
            self._take_recheck(wid, clock)
            return
        best = self._clock.get(wid)
        if best is None or clock["clock_offset_error_s"] < best["clock_offset_error_s"]:
            self._clock[wid] = best = clock
        pings = self._clock_pings[wid] = self._clock_pings.get(wid, 0) + 1
        if best["clock_offset_error_s"] > CLOCK_GOOD_ERROR_S and pings < CLOCK_PINGS:
            # Before the start the worker is idle (it sent READY): the pings can come closer.
            gevent.spawn_later(0.02 if self._preparing else 0.1, self._ping, wid)
            return
        if self.config is None or self.writer is None or wid in self.slots or wid in self.standby:
            return
        refusal = self._clock_refusal(wid, best)
        if refusal is not None and not self.allow_clock_offset:
            log.error("%s; it gets no part of the run", refusal)
            self.writer.run_info.setdefault("warnings", []).append(f"refused a worker that joined: {refusal}")
            self.env.runner.send_message(MSG_DENIED, {"why": refusal}, client_id=wid)
            return
        text = self._clock_warning(wid, best)
        if text:
            log.warning("%s", text)
            self.writer.run_info.setdefault("warnings", []).append(text)
        self._place_newcomer(wid)

    def _place_newcomer(self, client_id: str) -> None:
        """A worker joining during a run takes over a lost slot, or stands by for one.

        The schedule's split over workers is fixed at the start (session k belongs to slot
        k % n), so a worker that joins while every slot is held gets no arrivals: it stands by,
        takes over the slot of the next worker lost, and gets a slot at the next test start.
        """
        if self.config is None or self.writer is None or self._stopping_requested:
            return
        if client_id in self.slots or client_id in self.standby:  # Locust repeats client_ready after a stop
            return
        if not self._take_over_lost_slot(client_id):
            self.standby.append(client_id)
            log.warning(
                "worker %s joined during the run; every slot is held, so it stands by to take over a lost one",
                client_id,
            )
            self._write_lost()

    def _take_over_lost_slot(self, client_id: str) -> bool:
        """Give ``client_id`` the lowest lost slot nobody took over; its arrivals from now on."""
        free = sorted((info["slot"], wid) for wid, info in self.lost.items() if not info.get("replaced_by"))
        if not free or self.config is None:
            return False
        slot, old = free[0]
        now_s = time.time() - self.t0_unix_s
        start_s = max(0.0, now_s + TAKEOVER_LEAD_S)
        for sh in self.shares.get(old, []):
            sh.until_s = min(sh.until_s, start_s)
        # The newcomer sends the lost worker's whole holding from then on: its slot, and any
        # share of another lost worker it had adopted.
        self.shares[client_id] = [Share(sh.slot, list(sh.splits), max(sh.from_s, start_s)) for sh in self.shares.get(old, [])]
        for sh in self.shares[client_id]:
            if sh.slot != slot or sh.splits:
                self.env.runner.send_message(
                    MSG_ADOPT, {"run_id": self.config.run_id, "slot": sh.slot, "splits": sh.splits, "from_s": sh.from_s},
                    client_id,
                )  # fmt: skip
        self.lost[old].update(replaced_by=client_id, replaced_at_s=round(now_s, 3), arrivals_from_s=round(start_s, 3))
        self.slots[client_id] = slot
        plan = Plan(self.config, self.n_slots, slot, self.t0_unix_s).to_wire()
        plan["skip_before_s"] = start_s
        plan["clock_offset_s"] = self._clock.get(client_id, {}).get("clock_offset_s", 0.0)
        self.env.runner.send_message(MSG_PLAN, plan, client_id)
        log.warning(
            "worker %s takes over slot %d from lost worker %s (its arrivals from %.1fs)", client_id, slot, old, start_s
        )
        self._write_lost()
        return True

    def _next_standby(self) -> str | None:
        clients = self.env.runner.clients
        while self.standby:
            wid = self.standby.pop(0)
            node = clients.get(wid)
            if node is not None and node.state != STATE_MISSING:
                return wid
        return None

    def _watch_workers(self) -> None:
        # A quarter of Locust's heartbeat interval: a loss is named within 0.25 s of Locust's
        # verdict, so the worker's longer timeout keeps its margin (loadgen/runtime/loss_timeouts.py).
        while True:
            gevent.sleep(0.25)
            self._check_workers()

    def _check_workers(self) -> None:
        """Mark slot holders Locust found missing (silent for --worker-loss-timeout) or dropped as lost."""
        for wid, node in list(self.env.runner.clients.items()):
            if wid in self.slots and node.state == STATE_MISSING and not self._out_of_run(wid):
                self._mark_lost(wid)
        for wid in list(self.slots):
            if wid not in self.env.runner.clients and not self._out_of_run(wid) and wid not in self.finals:
                self._mark_lost(wid)

    def _mark_lost(self, wid: str, why: str = "missed heartbeats", left: bool = False) -> None:
        if self._out_of_run(wid):
            return  # counted already: one loss per worker out of the run
        state = self.worker_state.get(wid, {})
        previous = self.lost.get(wid)
        if previous is not None:
            # Back with its slot, then lost again: the first loss and its return stay as written;
            # this one is added beside them, and the worker is out of the run for good.
            previous.update(lost_again_at_s=round(time.time() - self.t0_unix_s, 3), why_again=why)
            previous["in_flight_sessions_again"] = [] if left else sorted(state.get("sessions", []))
            if left:
                previous["left_cleanly_again"] = True
            log.error("worker %s (%s, slot %s) lost again (%s)", wid, self._where(wid), previous["slot"], why)
            self._write_lost()
            self._after_loss(wid, why)
            return
        info = {
            "worker": wid,
            "pid": state.get("pid"),
            "slot": self.slots.get(wid),
            "lost_at_s": round(time.time() - self.t0_unix_s, 3) if self.t0_unix_s else 0.0,
            "why": why,
            # As of its last report: sessions started after it are not named. A worker that left
            # on its own sent everything in its final report: nothing of it is in flight.
            "in_flight_sessions": [] if left else sorted(state.get("sessions", [])),
        }
        if left:
            info["left_cleanly"] = True
        self.lost[wid] = info
        log.error(
            "worker %s (%s, slot %s) lost (%s); %d sessions were in flight",
            wid,
            self._where(wid),
            info["slot"],
            why,
            len(info["in_flight_sessions"]),
        )
        self._write_lost()
        self._after_loss(wid, why)

    def _after_loss(self, wid: str, why: str) -> None:
        """The run goes on without ``wid``: stop on it, or hand its arrivals to a standby or the others."""
        if self._expected_finals() <= self.finals:
            self._all_final.set()
        if self.config is not None and self.config.on_worker_loss == "abort" and not self._stopping_requested:
            self._abort_reason = f"worker {wid} lost ({why}) and --on-worker-loss abort stopped the run"
            self._request_stop()
            return
        if not self._expected_finals():
            if not self._planned_end and not self._abort_reason:
                everyone_left = all(w.get("left_cleanly") for w in self.lost.values())
                self._abort_reason = (
                    f"every worker was stopped ({why}) before the run's planned end"
                    if everyone_left
                    else "every worker was lost"
                )
            self._request_stop()
            return
        standby = self._next_standby()
        if standby is not None:
            self._take_over_lost_slot(standby)
        elif self._preparing:
            self._deferred_replans.append(wid)
        else:
            self._replan(wid)
        self._stop_if_all_done()

    def _replan(self, wid: str) -> None:
        """Hand the lost worker's arrivals not yet due to the workers still running, split evenly:
        session k stays session k (``loadgen.engine.driver.share_indices``). Closed loops are not
        re-planned: an agent's sessions follow each other, and the agent is gone."""
        cfg = self.config
        if cfg is None or cfg.concurrency or self._stopping_requested or self.writer is None:
            return
        survivors = sorted(self._expected_finals())
        if not survivors:
            return
        from_s = max(0.0, time.time() - self.t0_unix_s + TAKEOVER_LEAD_S)
        held = self.shares.get(wid, [])
        for sh in held:
            sh.until_s = min(sh.until_s, from_s)
        m = len(survivors)
        for sh in held:
            for j, survivor in enumerate(survivors):
                adopted = Share(sh.slot, [*sh.splits, [m, j]], max(sh.from_s, from_s))
                self.shares.setdefault(survivor, []).append(adopted)
                self.done_workers.discard(survivor)
                self.env.runner.send_message(
                    MSG_ADOPT,
                    {"run_id": cfg.run_id, "slot": adopted.slot, "splits": adopted.splits, "from_s": adopted.from_s},
                    survivor,
                )
        self.lost[wid].update(replanned_onto=survivors, arrivals_from_s=round(from_s, 3))
        log.warning("worker %s's arrivals from %.1fs re-planned onto %s", wid, from_s, ", ".join(survivors))
        self._write_lost()

    def _write_lost(self) -> None:
        if self.writer is not None:
            self.writer.update_run(
                lost_workers=list(self.lost.values()),
                workers=[self._worker_entry(w, s) for w, s in self.slots.items()],
                standby_workers=list(self.standby),
            )

    def _worker_entry(self, wid: str, slot: int) -> dict[str, Any]:
        """run.json ``workers[]``: who held a slot, from which host, whether it proved the secret."""
        auth = self.verified.get(wid, False)
        measured = self._ready.get(wid) or self._clock.get(wid, {})
        entry = {"id": wid, "host": hostname_of(wid), "slot": slot, "authenticated": auth, **measured}
        address = self._address(wid)
        if address:
            entry["address"] = address  # where its messages came from; "host" is what it claims
        return entry

    # ---------------------------------------------------------------- stop, verdict
    def _on_test_stopping(self, environment: Any, **_: Any) -> None:
        if self.config is not None and self._preparing:
            # Stopped while the workers were still loading the plan: the clock never starts.
            self._stopping_requested = True
            return
        if self.config is None or self.writer is None:
            return
        if self._draining:  # one drain a run, whichever path asked first; the others wait for it
            self._drained.wait()
            return
        self._draining = True
        try:
            self._drain_barrier()
        finally:
            self._drained.set()

    def _drain_barrier(self) -> None:
        assert self.config is not None and self.writer is not None
        self._stopping_requested = True
        deadline = self.config.stop_timeout_s
        if self.role == "master":
            # Locust stops the test itself when its last worker goes missing, maybe before our
            # watch loop looked: mark the losses now, so run.json and the verdict name them.
            self._check_workers()
        if self.role == "local":
            if self.driver is not None:
                self.driver.drain(deadline)
                self._collect()
            return
        expected = self._expected_finals()
        if not expected:
            return
        self._all_final.clear()
        if expected <= self.finals:
            return
        for wid in expected:
            self.env.runner.send_message(MSG_DRAIN, {"deadline_s": deadline, "run_id": self.config.run_id}, wid)
        if not self._all_final.wait(timeout=deadline + 10.0):
            missing = sorted(self._expected_finals() - self.finals)
            log.error("no final report from workers %s before the deadline; their last records are missing", missing)
            self.writer.update_run(missing_final_reports=missing)

    def _on_test_stop(self, environment: Any, **_: Any) -> None:
        if self.config is not None and self._preparing and self.verdict is None:
            for g in self._greenlets:
                g.kill(block=False)
            self._greenlets = []
            self.verdict = Verdict(
                EXIT_INCOMPLETE, "run incomplete: stopped before its arrivals started (the workers were loading the plan)"
            )
            return
        if self.config is None or self.writer is None:
            return
        for g in self._greenlets:
            g.kill(block=False)
        self._greenlets = []
        self._collect()
        self.t_end_unix_s = time.time()
        if self.live_view is not None:
            self.live_view.invalidate()  # the final numbers at once, not a snapshot from before the end
        cancelled = self._cancelled_counts()
        if not self._planned_end and not self._abort_reason:
            # Stopped by a signal, the UI's stop button or Locust's --run-time before the run's
            # own end (its duration, or every session done): the figures cover only part of it.
            self._abort_reason = (
                f"stopped after {time.time() - self.t0_unix_s:.1f} s, before its planned end "
                "(interrupted, stop button, or Locust's --run-time)"
            )
        status = RUN_ABORTED if self._abort_reason else RUN_COMPLETE
        accounting = self._close_accounting(aborted=status == RUN_ABORTED)
        self.writer.finish(
            status,
            requests_recorded=self.writer.records_written,
            cancelled_at_stop=cancelled,
            lost_workers=list(self.lost.values()),
            abort_reason=self._abort_reason,
            generator=self._generator_cpu(),
            accounting=accounting,
        )
        if self.progress is not None:
            self.progress.finish()
        failed, run_dir, self.writer = self.writer.failed, self.writer.dir, None
        if failed is not None:
            # No summary: it could not be written either. The records on disk are the run. Nor
            # Locust's own table (--json-file, written at exit): it would end in a traceback.
            if getattr(self.env.parsed_options, "json_file", None):
                self.env.parsed_options.json_file = None
            self.verdict = Verdict(
                EXIT_INCOMPLETE,
                f"run incomplete: {failed}; what was written is readable with 'loadgen report {run_dir}' "
                "once there is room",
            )
        else:
            # A usage error found during the run (a bad row of a streamed trace) stays the verdict.
            fatal = self.verdict if self.verdict is not None and self.verdict.exit_code == EXIT_USAGE else None
            self.verdict = fatal or decide_verdict(run_dir, self.config, self.env)
        if self.endpoint is not None:
            try:
                self.endpoint.run_ended(run_dir)
            except OSError as e:
                log.error("cannot write the final metrics snapshot in %s: %s", run_dir, e)
        if self.role == "master" and self._headless() and not self._quit_requested and not self._expected_finals():
            # Stopped by Locust, not by us, because its last worker went missing: headless,
            # nothing else would ever end the process.
            self._quit_requested = True
            gevent.spawn(self.env.runner.quit)

    def _fill_fingerprint(self, workload: Any) -> None:
        """A streamed trace's fingerprint hashes its bytes: in a thread, while the run goes on,
        into run.json when done (``run_record.run_info`` left it null)."""
        doc = self._run_info_doc.get("workload")
        if workload is None or not isinstance(doc, dict) or doc.get("fingerprint") is not None:
            return
        try:
            doc["fingerprint"] = off_the_loop(workload.fingerprint)
        except OSError as e:  # the file went away since the start: the run goes on, unpaired
            log.warning("%s: cannot hash the workload for run.json (%s)", doc.get("source"), e.strerror or e)
            return
        if self.writer is not None:
            self.writer.update_run(workload=doc)

    def _stop_on_bad_trace(self, message: str) -> None:
        """A streamed trace's count found a bad row during the run: stop, naming it (exit 2)."""
        self._abort_reason = message
        self._fatal(message, EXIT_USAGE)

    def _close_accounting(self, *, aborted: bool) -> dict[str, Any] | None:
        if self._fingerprint_greenlet is not None:  # run.json's last write carries it
            self._fingerprint_greenlet.join()
        acc = self.accounting
        if acc is None:
            return None
        if self._count_greenlet is not None:  # the planned count of a streamed trace, if still going
            self._count_greenlet.join(timeout=0 if aborted else None)
        if self.role == "local":
            started = {"local": self.driver.sessions_started if self.driver else 0}
        else:
            started = {w: int(s.get("started", 0)) for w, s in self.worker_state.items()}
        lost_shares = {w: self.shares.get(w, []) for w in self.lost if self._out_of_run(w)}
        # Off the loop: a streamed trace's lost shares are counted by reading the file again.
        off_the_loop(lambda: acc.close(started_by_worker=started, lost_shares=lost_shares, aborted=aborted))
        return acc.as_dict()

    def _generator_cpu(self) -> dict[str, Any]:
        """Each worker's CPU seconds and share of one core over its part of the run."""
        if self.role == "local":
            states = {"local": self._worker_payload(final=True)["state"]} if self.driver else {}
        else:
            states = self.worker_state
        return {**generator_cpu(states), **summarize_health(states)}

    def _cancelled_counts(self) -> dict[str, int]:
        if self.role == "local":
            d = self.driver
            return {"requests": d.requests_cancelled, "sessions": d.sessions_cancelled} if d else {}
        out = {"requests": 0, "sessions": 0}
        for s in self.worker_state.values():
            out["requests"] += s.get("requests_cancelled", 0)
            out["sessions"] += s.get("sessions_cancelled", 0)
        return out

    def _on_quitting(self, environment: Any, **_: Any) -> None:
        if self.writer is not None:
            # Quit without a stop: Locust's SIGTERM handler (a signal to this process or its
            # group, timeout(1), a dying parent). The run still drains and closes as any stop.
            if not self._stopping_requested and not self._planned_end and not self._abort_reason:
                self._abort_reason = (
                    f"stopped by a signal (SIGTERM) after {time.time() - self.t0_unix_s:.1f} s, before its planned end"
                )
            self._on_test_stopping(environment)
            self._on_test_stop(environment)
        elif self.config is not None and self._preparing and self.verdict is None:
            self.verdict = Verdict(
                EXIT_INCOMPLETE, "run incomplete: stopped before its arrivals started (the workers were loading the plan)"
            )
        if self.verdict is not None:
            environment.process_exit_code = self.verdict.exit_code
        if self.endpoint is not None:
            # After the results closed, so a last scrape sees the final numbers.
            self.endpoint.linger()

    def _on_quit(self, **_: Any) -> None:
        # Printed here, not in quitting: Locust prints its own tables after quitting (when not
        # given --json-file), and the verdict must be the last line a CI log shows.
        if self.verdict is not None and not self._verdict_printed:
            self._verdict_printed = True  # Locust's SIGTERM path (kill <pid>) shuts down twice
            if self.accounting is not None and self.t0_unix_s:
                print(self.accounting.line(), file=sys.stderr, flush=True)
            print(self.verdict.line, file=sys.stderr, flush=True)

    def _on_reset_stats(self, **_: Any) -> None:
        # The UI's reset button resets our live histograms too (the files keep everything).
        self.aggregate.reset_live()
        if self.live_view is not None:
            self.live_view.reset()
        if self.endpoint is not None:
            self.endpoint.invalidate()

    def _reset_collector(self) -> None:
        self.aggregate = MetricsAggregate()
        self.slots = {}
        self.worker_state = {}
        self.finals = set()
        self.done_workers = set()
        self.lost = {}
        self.standby = []
        self._stopping_requested = False
        self._quit_requested = False
        self._abort_reason: str | None = None
        self._planned_end = False
        self._draining = False
        self._drained = Event()
        self._preparing = False
        self._ready = {}
        self._plan_sent_at = {}
        self._plan_sent_wall = {}
        self._deferred_replans = []
        self.shares = {}
        self.accounting = None
        self.verdict = None

    # ================================================================ worker
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
            log.error("%s", message)
            print(f"Error: {message}", file=sys.stderr, flush=True)

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

    def _worker_payload(self, final: bool = False) -> dict[str, Any]:
        d = self.driver
        delta = self.recorder.take_delta().to_wire()
        delta["run_id"] = self.plan.config.run_id if self.plan else None
        delta["state"] = {
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
        }
        return delta

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
            log.warning("%s", text)
            print(f"warning: {text}", file=sys.stderr, flush=True)

    def _on_master_lost(self, silent_s: float) -> None:
        if self.driver is None or self.driver.done.is_set():
            # No load to stop: the master may be busy ending the run (its summary of a long run
            # takes seconds); an idle worker whose master is gone is ended by Locust's own timeout.
            log.warning("no heartbeat from the master for %.0f s", silent_s)
            return
        # Nobody records what this worker sends any more: stop the load now, and exit.
        message = f"master lost: no heartbeat for {silent_s:.0f} s; this worker stopped its load and exits"
        log.error("%s", message)
        print(f"Error: {message}", file=sys.stderr, flush=True)
        if self.driver is not None and not self.driver.done.is_set():
            self.driver.drain(0)
        self._final_sent = True  # nobody to send it to
        self.env.process_exit_code = EXIT_INCOMPLETE
        gevent.spawn(self.env.runner.quit)

    def _on_worker_test_stop(self, environment: Any, **_: Any) -> None:
        # The master's drain barrier normally ran first; this covers a stop without one.
        if self.driver is not None and not self.driver.done.is_set():
            self.driver.drain(0)


def install(environment: Any) -> LoadgenRuntime:
    """Attach loadgen to a Locust environment (called from the locustfile's init listener)."""
    rt = LoadgenRuntime(environment)
    environment.loadgen = rt
    rt.install()
    return rt


__all__ = ["LoadgenRuntime", "install"]
