"""Workers a master loses, and who sends their arrivals.

A slot holder Locust finds missing, or one that stopped on its own, is named in run.json; its
arrivals not yet due go to a standby worker (a takeover) or are split over the others (a re-plan);
one that comes back is merged again unless someone else took its work (docs/distributed.md).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import gevent
from locust.runners import STATE_MISSING, STATE_RUNNING

from loadgen.config import Plan
from loadgen.engine.recorder import wire_record_count
from loadgen.runtime.accounting import Share, handover_s
from loadgen.runtime.base import (
    MSG_ADOPT,
    MSG_DRAIN,
    MSG_PLAN,
)
from loadgen.runtime.join_auth import (
    hostname_of,
)

log = logging.getLogger("loadgen")


class WorkerLosses:
    """Part of ``MasterRuntime`` (its state: ``slots``, ``lost``, ``standby``, ``shares``,
    ``worker_state``): losses, returns, takeovers and re-plans."""

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
            rejected = wire_record_count(payload)
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
        start_s = handover_s(now_s)
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
        self.lost[old].update(replaced_by=client_id, replaced_at_s=round(now_s, 3), arrivals_from_s=start_s)
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
        from_s = handover_s(time.time() - self.t0_unix_s)
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
        self.lost[wid].update(replanned_onto=survivors, arrivals_from_s=from_s)
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
