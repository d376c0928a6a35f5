"""Distributed chaos: a master killed with SIGKILL, a worker frozen past the heartbeat timeout.

Real processes on 127.0.0.1: a sim with its truth log, ``loadgen master`` and ``loadgen worker``.
What the sim served is the ground truth for what reached it and when; the results directory is
what the master kept.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson
import psutil
import pytest

from loadgen.runtime.loss_timeouts import missed_checks
from loadgen.runtime.master_watch import CHECK_INTERVAL_S
from tests.conftest import free_port

from .runs import LOADGEN, loadgen, records, sim, truth

pytestmark = pytest.mark.slow

SEED = 5
H200 = ("--profile", "h200-llama3-8b-fp8")  # no request is ever refused: a 429 is not under test
# The workers here wait 8 s for a silent master (the least the master's default 5 s allows), so
# a test of a dead master is short. A worker whose master is gone stops within the watch's bound
# (that many silent checks, plus the check in progress) and exits within 4 s more (its Locust
# shutdown).
MASTER_LOSS_TIMEOUT_S = 8.0
MISSED_CHECKS_LIMIT = missed_checks(MASTER_LOSS_TIMEOUT_S)
WORKER_STOP_DEADLINE_S = (MISSED_CHECKS_LIMIT + 1) * CHECK_INTERVAL_S + 4.0


def _start(args: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [*LOADGEN, *args], stdout=log.open("wb"), stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )


@contextmanager
def _processes() -> Iterator[list[subprocess.Popen]]:
    """Processes the test starts; whatever still runs at the end is killed."""
    procs: list[subprocess.Popen] = []
    try:
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=10)


def _master(url: str, port: int, results: Path, run_id: str, *extra: str) -> list[str]:
    return [
        "master", "--headless", "--expect-workers", "2", "--master-port", str(port), "--target", url,
        "--workload", "tiny", "--seed", str(SEED), "--results", str(results), "--run-id", run_id,
        "--max-schedule-lag", "30s", *extra,
    ]  # fmt: skip


def _worker(port: int) -> list[str]:
    timeout = f"{MASTER_LOSS_TIMEOUT_S:g}s"
    return ["worker", "--master-host", "127.0.0.1", "--master-port", str(port), "--master-loss-timeout", timeout]


def _wait_for(predicate, timeout_s: float, what: str):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _run_json(run_dir: Path) -> dict:
    try:
        return orjson.loads((run_dir / "run.json").read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        return {}


def _locust_child(wrapper: subprocess.Popen) -> psutil.Process:
    """The Locust process that ``loadgen master``/``worker`` runs as its child."""
    return _wait_for(lambda: next(iter(psutil.Process(wrapper.pid).children()), None), 30, "a Locust process")


def _record_count(run_dir: Path) -> int:
    try:
        return (run_dir / "requests.jsonl").read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        # SO_REUSEADDR: the killed master's connections linger in TIME_WAIT; nobody listens.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_workers_stop_by_themselves_when_the_master_is_killed(tmp_path, capsys) -> None:
    port, results = free_port(), tmp_path / "results"
    run_dir = results / "mk"
    with sim(tmp_path, *H200, "--seed", "1") as (proc, truth_log), _processes() as procs:
        procs.append(_start(_master(proc.url, port, results, "mk", "--rate", "20", "--duration", "120s"), tmp_path / "m.log"))
        procs += [_start(_worker(port), tmp_path / f"w{i}.log") for i in range(2)]
        master = _locust_child(procs[0])
        family = {master.pid} | {p.pid for w in procs[1:] for p in [psutil.Process(w.pid), _locust_child(w)]}
        _wait_for(lambda: _record_count(run_dir) >= 20, 60, "20 records")
        t_kill_ns = time.perf_counter_ns()  # the sim's truth uses the same monotonic clock
        master.kill()
        for w in procs[1:]:
            assert w.wait(timeout=WORKER_STOP_DEADLINE_S + 5) == 5, (tmp_path / "w0.log").read_text()[-2000:]
        stopped_s = (time.perf_counter_ns() - t_kill_ns) / 1e9
        procs[0].wait(timeout=10)
        assert stopped_s <= WORKER_STOP_DEADLINE_S
        assert not [pid for pid in family if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
        assert _port_free(port)
        assert f"master lost: no heartbeat for {MASTER_LOSS_TIMEOUT_S:.0f} s" in (tmp_path / "w0.log").read_text()
        time.sleep(0.3)
        served = [t for rid, t in truth(truth_log).items() if rid.startswith("mk-")]
    # Nothing reached the server once the watch's bound had passed: the workers stopped their load.
    bound_ns = t_kill_ns + int((MISSED_CHECKS_LIMIT + 1) * CHECK_INTERVAL_S * 1e9)
    assert [t["request_id"] for t in served if t["t_received_ns"] > bound_ns] == []

    # What the master wrote before it died is a readable partial run.
    # The front marks the run aborted and says why (the master could not).
    info = _run_json(run_dir)
    assert info["status"] == "aborted" and info["abort_reason"] == "the Locust master was killed by SIGKILL"
    recs = records(run_dir)
    assert len(recs) >= 20 and len({r.request_id for r in recs}) == len(recs)
    assert {r.request_id for r in recs} <= {t["request_id"] for t in served}
    r = loadgen("report", str(run_dir))
    assert r.returncode == 0, r.stderr
    assert "partial" in r.stdout.lower()
    with capsys.disabled():
        print(f"\n[master killed] workers exited {stopped_s:.1f} s after the kill; {len(recs)} records kept")


def test_a_worker_frozen_past_the_heartbeat_timeout_is_lost_re_planned_and_not_counted_twice(tmp_path, capsys) -> None:
    # 300 sessions at 30/s: arrivals go on for 10 s. One worker is frozen (SIGSTOP) 1 s in until
    # the master names it lost (silent for 5 s, the default --worker-loss-timeout), then thawed. Its arrivals not yet due
    # went to the other worker when it was lost, so the thawed one's late reports are rejected
    # and it is told to stop: no session is sent or recorded twice, and the run is incomplete
    # (the sessions it had in flight are not on record).
    n, port, results = 300, free_port(), tmp_path / "results"
    run_dir = results / "fz"
    with sim(tmp_path, *H200, "--seed", "1") as (proc, truth_log), _processes() as procs:
        args = _master(proc.url, port, results, "fz", "--rate", "30", "--num-sessions", str(n))
        procs.append(_start(args, tmp_path / "m.log"))
        workers = [_start(_worker(port), tmp_path / f"w{i}.log") for i in range(2)]
        procs += workers
        victim = _locust_child(workers[0])
        info = _wait_for(lambda: (i := _run_json(run_dir)).get("workers") and i, 60, "the run to start")
        time.sleep(max(0.0, info["t0_unix_s"] + 1.0 - time.time()))
        victim.suspend()
        t_frozen = time.monotonic()
        try:
            _wait_for(lambda: _run_json(run_dir).get("lost_workers"), 20, "the frozen worker to be named lost")
        finally:
            frozen_s = time.monotonic() - t_frozen
            victim.resume()
        assert procs[0].wait(timeout=60) == 5, (tmp_path / "m.log").read_text()[-3000:]
        verdict = (tmp_path / "m.log").read_text().strip().splitlines()[-1]
        time.sleep(0.3)
    assert verdict.startswith("loadgen verdict: FAIL (exit 5): run incomplete: 1 worker lost"), verdict
    info = _run_json(run_dir)
    recs = records(run_dir)
    served = {rid: t for rid, t in truth(truth_log).items() if rid.startswith("fz-")}

    assert info["status"] == "complete"
    [lost] = info["lost_workers"]
    assert lost["pid"] == victim.pid and "returned_at_s" not in lost and lost["told_to_stop"] is True
    [survivor] = lost["replanned_onto"]
    # Nothing twice, nothing invented; the survivor sent the lost slot's arrivals from the re-plan on.
    seen = Counter((r.session_index, r.turn_index) for r in recs)
    assert [k for k, c in seen.items() if c > 1] == []
    assert info["requests_recorded"] == len(recs) == len({r.request_id for r in recs})
    assert {r.request_id for r in recs} <= set(served)
    assert all(r.t_end_us / 1e6 <= lost["lost_at_s"] for r in recs if r.worker == lost["worker"])
    adopted = [r for r in recs if r.worker == survivor and r.session_index % 2 == lost["slot"]]
    assert adopted and all(r.t_sched_us / 1e6 >= lost["arrivals_from_s"] for r in adopted if r.turn_index == 0)
    acc = info["accounting"]
    assert acc["sessions_started"] + sum(acc["sessions_not_started"].values()) == n
    with capsys.disabled():
        print(
            f"\n[frozen worker] frozen {frozen_s:.1f} s, lost at {lost['lost_at_s']} s; {len(adopted)} of its slot's "
            f"requests sent by the survivor from {lost['arrivals_from_s']} s; {lost.get('late_records_rejected')} late records rejected"
        )


def test_a_frozen_worker_whose_slot_was_taken_over_is_rejected_when_it_comes_back(tmp_path, capsys) -> None:
    # 2 slots and a standby. One slot holder is frozen until the standby has taken its slot over,
    # then thawed: from then on two workers hold the slot, so the master must reject the thawed
    # one's reports and tell it to stop, and no session may be recorded twice.
    n, port, results = 640, free_port(), tmp_path / "results"
    run_dir = results / "tk"
    with sim(tmp_path, *H200, "--seed", "1") as (proc, truth_log), _processes() as procs:
        # The master loses the frozen worker after 3 s of silence (not the default 5 s): the standby
        # then takes the slot over with most of the slot's arrivals still to come.
        args = _master(proc.url, port, results, "tk", "--rate", "40", "--num-sessions", str(n), "--worker-loss-timeout", "3s")
        procs.append(_start(args, tmp_path / "m.log"))
        workers = [_start(_worker(port), tmp_path / f"w{i}.log") for i in range(2)]
        procs += workers
        victim = _locust_child(workers[0])
        _wait_for(lambda: _run_json(run_dir).get("workers"), 60, "the run to start")
        procs.append(_start(_worker(port), tmp_path / "standby.log"))
        [standby] = _wait_for(lambda: _run_json(run_dir).get("standby_workers"), 30, "a standby")
        victim.suspend()
        try:
            _wait_for(lambda: any(w.get("replaced_by") for w in _run_json(run_dir).get("lost_workers", [])), 20, "a takeover")
        finally:
            victim.resume()
        # The sessions the frozen worker had in flight are not on record: the run is incomplete.
        assert procs[0].wait(timeout=60) == 5, (tmp_path / "m.log").read_text()[-3000:]
        time.sleep(0.3)
    info = _run_json(run_dir)
    recs = records(run_dir)
    served = {rid: t for rid, t in truth(truth_log).items() if rid.startswith("tk-")}

    [lost] = info["lost_workers"]
    assert lost["pid"] == victim.pid and lost["replaced_by"] == standby and "returned_at_s" not in lost
    # Thawed, it ships the records it finished (or cut) since its last report before the freeze,
    # the sessions it had in flight among them: every one is refused, none merged.
    assert lost["told_to_stop"] is True and lost["late_records_rejected"] > 0
    slot = lost["slot"]
    # Nothing twice; the thawed worker's records are all ones that reached the master before the loss.
    assert len({r.request_id for r in recs}) == len(recs) == info["requests_recorded"]
    assert [k for k, c in Counter((r.session_index, r.turn_index) for r in recs).items() if c > 1] == []
    assert {r.request_id for r in recs} <= set(served)
    assert all(r.t_end_us / 1e6 <= lost["lost_at_s"] for r in recs if r.worker == lost["worker"])
    # The other slot, and the standby's part of the taken-over one, lost nothing the sim served.
    unrecorded = set(served) - {r.request_id for r in recs}
    assert all(int(rid.split("-")[1]) % 2 == slot for rid in unrecorded)
    taken = [r for r in recs if r.worker == standby]
    assert taken and all(r.session_index % 2 == slot and r.t_sched_us / 1e6 >= lost["arrivals_from_s"] for r in taken)
    with capsys.disabled():
        print(
            f"\n[taken-over worker] lost at {lost['lost_at_s']} s, slot taken at {lost['replaced_at_s']} s; "
            f"{lost['late_records_rejected']} late records rejected; the standby ran {len(taken)} requests"
        )
