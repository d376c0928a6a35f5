"""Clock skew: a worker whose wall clock is 0.2 s ahead is measured in the READY/GO handshake and
anchored for it, so its arrivals reach the server on time (checked against the sim's truth)."""

from __future__ import annotations

import os
import signal
import statistics
import time

import pytest

from loadgen.engine.worker_clock import CLOCK_GOOD_ERROR_S, CLOCK_PINGS
from tests.conftest import free_port

from .runs import LOADGEN, records, sim, truth
from .test_distributed_runs import H200, _master_args, _processes, _run_info, _worker_args
from .test_worker_auth import _start

pytestmark = pytest.mark.slow

SKEW_S = 0.2


def test_a_worker_with_a_skewed_clock_is_measured_and_sends_on_time(tmp_path) -> None:
    port, results, run_id, n = free_port(), tmp_path / "results", "skew", 20
    with sim(tmp_path, *H200, "--seed", "1") as (proc, truth_log), _processes() as procs:
        args = _master_args(proc.url, port, results, run_id, 1, "--rate", "20", "--num-sessions", str(n), "--allow-clock-offset")
        procs.append(_start([*LOADGEN, *args], tmp_path / "master.log"))
        procs.append(_start([*LOADGEN, *_worker_args(port)], tmp_path / "worker.log", LOADGEN_WORKER_CLOCK_OFFSET_S=str(SKEW_S)))
        assert procs[0].wait(timeout=60) == 0, (tmp_path / "master.log").read_text()[-3000:]
        master_log = (tmp_path / "master.log").read_text()
    # This process's clock is the master's (same host, no offset): wall time = perf time + this.
    wall_minus_perf_s = time.time() - time.perf_counter_ns() / 1e9
    info = _run_info(results / run_id)
    recs = records(results / run_id)
    served = truth(truth_log)

    [worker] = info["workers"]
    assert abs(worker["clock_offset_s"] - SKEW_S) < 0.010, worker
    assert 0 <= worker["clock_offset_error_s"] < 0.010, worker
    # The READY sample is refined by pings before the start, until one is within 2 ms or 8 came.
    assert worker["clock_samples"] >= 1, worker
    assert worker["clock_offset_error_s"] <= CLOCK_GOOD_ERROR_S or worker["clock_samples"] == 1 + CLOCK_PINGS, worker
    assert any(f"{worker['id']}'s clock is +" in w for w in info["warnings"]), info["warnings"]
    assert any("accepted with --allow-clock-offset" in w for w in info["warnings"]), info["warnings"]
    assert "ms off the master's" in master_log

    # Each first turn's arrival at the server against its intended time on the master's clock.
    late_ms = []
    for r in recs:
        if r.turn_index == 0:
            intended_perf_s = info["t0_unix_s"] + r.t_sched_us / 1e6 - wall_minus_perf_s
            late_ms.append((served[r.request_id]["t_received_ns"] / 1e9 - intended_perf_s) * 1000)
    assert len(late_ms) == n
    # Uncorrected, every arrival would come 200 ms early.
    assert min(late_ms) > -20 and statistics.median(late_ms) < 20, sorted(late_ms)


def _first_turn_lateness_ms(info: dict, recs: list, served: dict, wall_minus_perf_s: float, worker: str) -> list[float]:
    out = []
    for r in recs:
        if r.turn_index == 0 and r.worker == worker:
            intended_perf_s = info["t0_unix_s"] + r.t_sched_us / 1e6 - wall_minus_perf_s
            out.append((served[r.request_id]["t_received_ns"] / 1e9 - intended_perf_s) * 1000)
    return out


def test_a_skewed_worker_that_takes_over_a_lost_slot_mid_run_is_measured_too(tmp_path) -> None:
    from .test_distributed_runs import _locust_child, _sleep_until_unix, _started_run, _wait_for

    port, results, run_id = free_port(), tmp_path / "results", "skew-late"
    with sim(tmp_path, *H200, "--seed", "1") as (proc, truth_log), _processes() as procs:
        # Two slots: a run whose every worker is lost stops, with nobody left to hand a slot to.
        args = _master_args(proc.url, port, results, run_id, 2, "--rate", "20", "--num-sessions", "180", "--allow-clock-offset")
        procs.append(_start([*LOADGEN, *args], tmp_path / "master.log"))
        first = _start([*LOADGEN, *_worker_args(port)], tmp_path / "first.log")
        procs += [first, _start([*LOADGEN, *_worker_args(port)], tmp_path / "second.log")]
        info = _wait_for(lambda: _started_run(results / run_id), 60, "the run to start")
        late = _start([*LOADGEN, *_worker_args(port)], tmp_path / "late.log", LOADGEN_WORKER_CLOCK_OFFSET_S=str(SKEW_S))
        procs.append(late)
        victim = _locust_child(first)
        _sleep_until_unix(info["t0_unix_s"] + 2.0)
        os.kill(victim, signal.SIGKILL)
        assert procs[0].wait(timeout=60) in (0, 5), (tmp_path / "master.log").read_text()[-3000:]
    wall_minus_perf_s = time.time() - time.perf_counter_ns() / 1e9
    info = _run_info(results / run_id)
    recs = records(results / run_id)
    [lost] = info["lost_workers"]
    newcomer = lost["replaced_by"]
    [entry] = [w for w in info["workers"] if w["id"] == newcomer]
    assert abs(entry["clock_offset_s"] - SKEW_S) < 0.010, entry
    # The survivor held its slot for the whole ~9 s run: its clock was measured again mid-run
    # (every 5 s), and had not drifted from the offset it was anchored on.
    [survivor] = [w for w in info["workers"] if w["id"] not in (newcomer, lost["worker"])]
    assert survivor["clock_rechecks"] >= 1, survivor
    assert abs(survivor["clock_drift_s"]) <= survivor["clock_offset_error_s"] + 0.010, survivor
    late_ms = _first_turn_lateness_ms(info, recs, truth(truth_log), wall_minus_perf_s, newcomer)
    assert len(late_ms) > 10
    assert min(late_ms) > -20 and statistics.median(late_ms) < 20, sorted(late_ms)


def test_a_worker_whose_clock_is_off_past_the_bound_is_refused_before_load(tmp_path) -> None:
    """Without --allow-clock-offset, a worker 0.2 s off (default bound 5 ms) ends the run before
    any load: exit 2, one line naming the worker and its offset."""
    port, results, run_id = free_port(), tmp_path / "results", "skew-refused"
    with sim(tmp_path, *H200, "--seed", "1") as (proc, truth_log), _processes() as procs:
        args = _master_args(proc.url, port, results, run_id, 1, "--rate", "20", "--num-sessions", "10")
        procs.append(_start([*LOADGEN, *args], tmp_path / "master.log"))
        procs.append(_start([*LOADGEN, *_worker_args(port)], tmp_path / "worker.log", LOADGEN_WORKER_CLOCK_OFFSET_S=str(SKEW_S)))
        code = procs[0].wait(timeout=60)
        out = (tmp_path / "master.log").read_text()
        served = [rid for rid in truth(truth_log) if rid.startswith(f"{run_id}-")]
    assert code == 2, out[-3000:]
    errors = [line for line in out.splitlines() if line.startswith("Error: worker ")]
    assert len(errors) == 1, out[-3000:]
    measured_ms = float(errors[0].split("'s clock is ", 1)[1].split(" ms", 1)[0])
    assert abs(measured_ms - SKEW_S * 1000) < 10 and "over --max-clock-offset 5ms" in errors[0], errors[0]
    assert "--allow-clock-offset" in errors[0] and "Traceback" not in out
    assert served == []  # nothing reached the target
