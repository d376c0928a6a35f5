"""The master of a distributed run, inside Locust.

At ``test_start`` it sends every connected worker that proved the join secret a plan (config, n,
slot, t0), measures each worker's clock from the READY/GO stamps, and starts the clock when all
are ready. It merges the workers' histogram deltas exactly and appends their records; workers
lost mid-run (missed heartbeats, or stopped on their own) are named in run.json and their
arrivals handed to a standby or the others; a worker joining mid-run takes over a lost slot or
stands by for one (docs/distributed.md). The stop, the results and the verdict are the
collector's (``collector.py``).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import gevent
from gevent.event import Event
from locust.runners import STATE_MISSING, STATE_RUNNING

from loadgen.config import Plan, RunConfig
from loadgen.engine.recorder import Delta, wire_record_count
from loadgen.engine.worker_clock import (
    CLOCK_GOOD_ERROR_S,
)
from loadgen.errors import UserError
from loadgen.runtime.accounting import Share
from loadgen.runtime.base import (
    MSG_AUTH,
    MSG_CLOCK,
    MSG_DONE,
    MSG_DRAIN,
    MSG_FINAL,
    MSG_GO,
    MSG_HELLO,
    MSG_PLAN,
    MSG_READY,
    READY_WAIT_S,
    SPAWN_WAIT_S,
    START_LEAD_LOCAL_S,
    VERIFIED_WAIT_S,
)
from loadgen.runtime.collector import Collector
from loadgen.runtime.file_ship import (
    MSG_FILE_CHUNK,
    MSG_FILE_PULL,
    read_chunk,
    shipped_size,
)
from loadgen.runtime.join_auth import (
    ALLOW_ENV,
    SECRET_ENV,
    UNAUTHENTICATED_WARNING,
)
from loadgen.runtime.join_gate import JoinGate, install_join_gate
from loadgen.runtime.loss_timeouts import (
    apply_to_master,
)
from loadgen.runtime.master_joins import JoinsAndClocks
from loadgen.runtime.master_losses import WorkerLosses
from loadgen.runtime.master_quit import install_prompt_quit
from loadgen.runtime.peer_address import PeerAddresses
from loadgen.runtime.stop_request import STOP_SIGNAL
from loadgen.runtime.verdict import EXIT_INCOMPLETE

log = logging.getLogger("loadgen")

class MasterRuntime(JoinsAndClocks, WorkerLosses, Collector):
    """The master of a distributed run: plans for every worker, their joins, clocks and losses,
    the exact merge of their reports."""

    role = "master"

    def __init__(self, environment: Any) -> None:
        super().__init__(environment)
        self.slots: dict[str, int] = {}
        self.worker_state: dict[str, dict[str, Any]] = {}
        self.finals: set[str] = set()
        self.done_workers: set[str] = set()
        self.lost: dict[str, dict[str, Any]] = {}
        # Reports whose records could not be read, per worker (run.json ``unreadable_reports``).
        self.unreadable: dict[str, dict[str, Any]] = {}
        self.standby: list[str] = []  # connected during the run without a slot, in join order
        self._all_final = Event()
        self._ready: dict[str, dict[str, Any]] = {}
        self._plan_sent_at: dict[str, float] = {}
        self._plan_sent_wall: dict[str, float] = {}  # master's wall clock when the plan left (t0m)
        self._deferred_replans: list[str] = []
        self.shares: dict[str, list[Share]] = {}  # the parts of the schedule each worker holds
        # joining: the secret workers must prove; who proved it (True) or was let in without one
        # (False); the challenges outstanding; the ids already logged as ignored
        self.join_secret: str | None = os.environ.get(SECRET_ENV, "").strip() or None
        self.allow_unauthenticated = os.environ.get(ALLOW_ENV) == "1"
        self.verified: dict[str, bool] = {}
        self._challenges: dict[str, str] = {}
        self._ignored_logged: set[str] = set()
        self._refused: set[str] = set()  # answered wrong: no second try for that client id
        self._clock: dict[str, dict[str, float]] = {}  # offsets of workers that joined mid-run
        self._clock_pings: dict[str, int] = {}
        self._recheck: dict[str, dict[str, Any]] = {}  # a slot holder's clock re-measured mid-run
        self._drift_warned: set[str] = set()
        self.join_gate: JoinGate | None = None  # Locust's own messages wait for the join secret too
        self.peers: PeerAddresses | None = None  # the address each worker's messages come from

    def install(self) -> None:
        super().install()
        ev = self.env.events
        runner = self.env.runner
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
        elif getattr(self.env, "web_ui", None) is not None:
            self._install_start_gate(self.env.web_ui)

    # ---------------------------------------------------------------- the run, as a master runs it
    def _begin(self, environment: Any) -> None:
        gevent.spawn(self._begin_after_spawn, environment)

    def _prepare_config(self, cfg: RunConfig) -> None:
        cfg.workload_pull_bytes = shipped_size(cfg)  # a worker without the file pulls it

    def _hand_out(self, cfg: RunConfig, workload: Any) -> None:
        """Every accepted worker gets a slot and its plan; the clock starts once all are ready."""
        assert self.accounting is not None
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

    def _before_results(self) -> None:
        self._warn_clock_offsets()

    def _start_load(self, t0_unix_s: float) -> None:
        assert self.config is not None
        for wid in self._expected_finals():
            offset = float(self._ready.get(wid, {}).get("clock_offset_s") or 0.0)
            go = {"run_id": self.config.run_id, "t0": t0_unix_s, "clock_offset_s": offset}
            self.env.runner.send_message(MSG_GO, go, client_id=wid)
        self._write_lost()
        for wid in self._deferred_replans:
            self._replan(wid)
        self._deferred_replans = []

    def _after_start(self) -> None:
        from loadgen.runtime.helper_threads import yield_helper_threads
        from loadgen.runtime.master_gc import collect_periodically, freeze_startup_heap
        from loadgen.runtime.master_priority import yield_to_workers

        yield_to_workers()  # the workers time tokens; the master's work can wait a slice
        yield_helper_threads()  # and its zmq threads, which receive the reports, too
        self._greenlets.append(gevent.spawn(self._recheck_clocks))
        freeze_startup_heap()
        self._greenlets.append(gevent.spawn(collect_periodically))

    def _run_info(self, cfg: RunConfig) -> dict[str, Any]:
        doc = super()._run_info(cfg)
        unauthenticated = self.join_secret is None and self.allow_unauthenticated
        doc["worker_auth"] = {
            "join_secret_required": self.join_secret is not None,
            "allow_unauthenticated_workers": unauthenticated,
        }
        if unauthenticated:
            doc.setdefault("warnings", []).append(UNAUTHENTICATED_WARNING)
        return doc

    def _drain(self, deadline_s: float) -> None:
        assert self.config is not None and self.writer is not None
        # Locust stops the test itself when its last worker goes missing, maybe before our
        # watch loop looked: mark the losses now, so run.json and the verdict name them.
        self._check_workers()
        expected = self._expected_finals()
        if not expected:
            return
        self._all_final.clear()
        if expected <= self.finals:
            return
        for wid in expected:
            self.env.runner.send_message(MSG_DRAIN, {"deadline_s": deadline_s, "run_id": self.config.run_id}, wid)
        if not self._all_final.wait(timeout=deadline_s + 10.0):
            missing = sorted(self._expected_finals() - self.finals)
            log.error("no final report from workers %s before the deadline; their last records are missing", missing)
            self.writer.update_run(missing_final_reports=missing)

    def _after_results_closed(self) -> None:
        if self._headless() and not self._quit_requested and not self._expected_finals():
            # Stopped by Locust, not by us, because its last worker went missing: headless,
            # nothing else would ever end the process.
            self._quit_requested = True
            gevent.spawn(self.env.runner.quit)

    def _worker_counts(self) -> dict[str, int]:
        # A lost worker that came back and was merged again is active, as run.json says.
        return {
            "active": sum(1 for w in self.slots if not self._out_of_run(w)),
            "lost": sum(1 for w in self.lost if self._out_of_run(w)),
            "standby": len(self.standby),
        }

    def _worker_states(self) -> dict[str, dict[str, Any]]:
        return self.worker_state

    def _lost_workers(self) -> list[dict[str, Any]]:
        return list(self.lost.values())

    def _lost_shares(self) -> dict[str, list[Share]]:
        return {w: self.shares.get(w, []) for w in self.lost if self._out_of_run(w)}

    def _reset_collector(self) -> None:
        super()._reset_collector()
        self.slots = {}
        self.worker_state = {}
        self.finals = set()
        self.done_workers = set()
        self.lost = {}
        self.unreadable = {}
        self.standby = []
        self._ready = {}
        self._plan_sent_at = {}
        self._plan_sent_wall = {}
        self._deferred_replans = []
        self.shares = {}

    # ---------------------------------------------------------------- the workers' messages

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

    def _merge(self, delta: Delta) -> None:
        records = self.aggregate.merge(delta)
        if self.writer is not None and records:
            self.writer.append_records(records)
            if self.accounting is not None:
                self.accounting.count(records)
            self.writer.flush_records()  # on disk now: a kill of the master loses nothing received
            self._stop_if_unwritable()

    def _in_flight_summary(self) -> tuple[int, int, int]:
        """(sessions started, sessions in flight, requests in flight) over all workers."""
        started = sum(s.get("started", 0) for s in self.worker_state.values())
        # A lost worker's last state is not in flight any more: it is lost (run.json names it).
        alive = [s for wid, s in self.worker_state.items() if not self._out_of_run(wid)]
        sessions = sum(len(s.get("sessions", ())) for s in alive)
        requests = sum(s.get("requests", 0) for s in alive)
        return started, sessions, requests

    def _on_worker_report(self, client_id: str, data: dict[str, Any], **_: Any) -> None:
        payload = data.get("loadgen")
        if payload is None or self._ignored(client_id) or self.writer is None:
            return
        if payload.get("run_id") != (self.config.run_id if self.config else None):
            return
        if self._out_of_run(client_id) and not self._readmit(client_id, payload):
            return
        try:
            delta = Delta.from_wire(payload)
        except ValueError as e:
            self._unreadable_report(client_id, payload, str(e))
        else:
            self._merge(delta)
        self.worker_state[client_id] = payload.get("state", {})

    def _unreadable_report(self, wid: str, payload: dict[str, Any], why: str) -> None:
        """A report whose records cannot be read (a worker of another version, or a damaged or
        forged message): none of it is merged, so the run's histograms and its records agree;
        run.json names it and the verdict says the run is incomplete."""
        lost = wire_record_count(payload)
        entry = self.unreadable.setdefault(wid, {"worker": wid, "reports": 0, "records": 0})
        entry.update(reports=entry["reports"] + 1, records=entry["records"] + lost, why=why)
        log.error("worker %s sent a report the master cannot read, %d records lost: %s", wid, lost, why)
        if self.writer is not None:
            self.writer.update_run(unreadable_reports=list(self.unreadable.values()))

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

    def _cancelled_counts(self) -> dict[str, int]:
        out = {"requests": 0, "sessions": 0}
        for s in self.worker_state.values():
            out["requests"] += s.get("requests_cancelled", 0)
            out["sessions"] += s.get("sessions_cancelled", 0)
        return out
