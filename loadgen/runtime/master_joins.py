"""Who may join a master's run, and each worker's clock.

The join secret's challenge and answer (``join_auth.py``), a worker joining during a run, the
clock offset measured from the READY/GO stamps, refined by pings before the start and rechecked
during the run (``engine/worker_clock.py``), and the refusal of a worker whose clock is off.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import gevent
from locust.runners import STATE_MISSING

from loadgen.engine.worker_clock import (
    CLOCK_GOOD_ERROR_S,
    CLOCK_PINGS,
    CLOCK_RECHECK_PINGS,
    CLOCK_RECHECK_S,
    CLOCK_REFINE_WAIT_S,
    clock_offset_refusal,
)
from loadgen.runtime.base import (
    CLOCK_OFFSET_WARN_S,
    MSG_CHALLENGE,
    MSG_CLOCK,
    MSG_DENIED,
    SPAWN_WAIT_S,
    VERIFIED_WAIT_S,
)
from loadgen.runtime.join_auth import (
    hostname_of,
    is_loopback,
    new_nonce,
    verify,
)
from loadgen.runtime.verdict import EXIT_USAGE

log = logging.getLogger("loadgen")


def no_worker_message(waited_s: float) -> str:
    """The web form's answer to a start when no worker has joined."""
    return (
        f"no worker has joined this master yet (waited {waited_s:g} s), so nothing started: start the "
        "workers (loadgen worker --master-host HOST), check that they reach this master's port, "
        "then start the run again"
    )


class JoinsAndClocks:
    """Part of ``MasterRuntime`` (its state: ``join_secret``, ``verified``, ``_clock``, ``_ready``,
    ``slots``, ``standby``): joins and clocks, apart from the run's own course."""

    def _await_workers(self) -> None:
        """Headless master: wait (briefly) here, in ``init``, for the expected workers.

        Locust's headless start checks for them once and then sleeps a whole second before it
        looks again; forked workers connect within tens of milliseconds, so finding them on its
        first look saves most of that second on every run.
        """
        self._await_verified(SPAWN_WAIT_S)

    def _install_start_gate(self, web_ui: Any) -> None:
        """The web form's start waits for the workers, as a headless start does.

        A start (``POST /swarm``) that came before any worker joined made Locust's master log a
        warning and start nothing, while the form's answer said it started: a user who clicked
        as soon as the page loaded (or a script that posted the form) waited for a run that never
        came. Now the start waits up to ``SPAWN_WAIT_S`` for --expect-workers workers and goes on
        with those that joined; with none, its answer says so and nothing starts.
        """
        from flask import jsonify

        app = web_ui.app
        names = [r.endpoint for r in app.url_map.iter_rules() if r.rule.endswith("/swarm") and "POST" in r.methods]
        if not names:
            return
        name = names[0]
        start = app.view_functions[name]

        def start_when_workers_joined(*args: Any, **kwargs: Any) -> Any:
            t = time.monotonic()
            self._await_verified(SPAWN_WAIT_S)
            if not self._accepted_workers():
                message = no_worker_message(round(time.monotonic() - t, 1))
                return jsonify({"success": False, "message": message, "host": self.env.host})
            return start(*args, **kwargs)

        # Behind the login, when there is one: a visitor who has not logged in learns nothing.
        app.view_functions[name] = web_ui.auth_required_if_enabled(start_when_workers_joined)

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
