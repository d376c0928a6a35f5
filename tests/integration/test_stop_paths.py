"""Every way a run can be stopped ends with every request the server received on record, an
accounting that adds up and a verdict that says the run is incomplete (exit 5), never PASS.

The server is real (the sim with its truth log, or the hostile server with its request log, on
127.0.0.1); so are the `loadgen run` front, Locust's master and its workers. Each run is bounded
by its own duration and an outer timeout, and the signals go only to the process group the test
started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson

from tests import hostile_server

from .runs import LOADGEN, records, sim, truth

HOSTILE = Path(hostile_server.__file__)


def _start(args: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [*LOADGEN, "run", *args],
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _wait_records(results: Path, n: int, p: subprocess.Popen, log: Path, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not any(len(f.read_bytes().splitlines()) >= n for f in results.glob("*/requests.jsonl")):
        assert p.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.05)


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d.name))
            except (OSError, IndexError, ValueError):
                pass
    return out


def _finish(p: subprocess.Popen, timeout_s: float = 60.0) -> int:
    try:
        return p.wait(timeout=timeout_s)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)


def _verdict(log: Path) -> tuple[str, str, str]:
    """(the accounting line, the verdict line, all of stderr); the verdict must be the last line."""
    err = log.read_text()
    lines = [line for line in err.splitlines() if line.strip()]
    verdicts = [line for line in lines if line.startswith("loadgen verdict:")]
    assert len(verdicts) == 1 and lines[-1] == verdicts[0], err[-3000:]
    accounting = [line for line in lines if line.startswith("loadgen accounting:")]
    return (accounting[-1] if accounting else ""), verdicts[0], err


def _served(truth_log: Path) -> set[str]:
    return {rid for rid in truth(truth_log) if not rid.startswith("loadgen-preflight")}


def _sim_run(tmp_path: Path, sig_target: str) -> tuple[int, Path, Path, str, str, str, set[str]]:
    results, log = tmp_path / "results", tmp_path / "run.log"
    with sim(tmp_path, "--profile", "tiny", "--time-scale", "3", "--seed", "4") as (proc, truth_log):
        p = _start(
            ["--target", proc.url, "--workload", "tiny", "--rate", "15", "--duration", "60s", "--seed", "4",
             "--results", str(results), "--max-schedule-lag", "60s"], log,
        )  # fmt: skip
        _wait_records(results, 8, p, log)
        if sig_target == "group":
            os.killpg(p.pid, signal.SIGTERM)  # as timeout(1) or a CI runner's cancel does
        elif sig_target == "master":
            (master,) = _children(p.pid)
            os.kill(master, signal.SIGTERM)
        elif sig_target == "front-kill":
            os.kill(p.pid, signal.SIGKILL)  # its children get SIGTERM (they die with it)
        rc = _finish(p)
        if sig_target == "front-kill":
            # Nobody waits for the master now: wait for its verdict line in the shared log.
            deadline = time.monotonic() + 60
            while "loadgen verdict:" not in log.read_text() and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(0.5)
        served = _served(truth_log)
    accounting, verdict, err = _verdict(log)
    return rc, results, log, accounting, verdict, err, served


def _check_whole_record(results: Path, served: set[str], accounting: str) -> dict:
    run_dir = next(results.iterdir())
    info = orjson.loads((run_dir / "run.json").read_bytes())
    recs = records(run_dir)
    recorded = {r.request_id for r in recs}
    assert served and served == recorded, f"{len(served - recorded)} of {len(served)} requests unrecorded"
    acc = info["accounting"]
    assert acc["requests_sent"] == len(recs)
    out = acc["outcomes"]
    assert out["ok"] + out["failed"] + out["cut_at_stop"] == acc["requests_sent"]
    assert acc["sessions_started"] + sum(acc["sessions_not_started"].values()) == acc["arrivals_planned"]
    assert f"{acc['requests_sent']} requests sent" in accounting
    return info


def test_sigterm_to_the_process_group_drains_records_everything_and_exits_5(tmp_path) -> None:
    rc, results, _log, accounting, verdict, err, served = _sim_run(tmp_path, "group")
    assert "Traceback" not in err and "Exception ignored" not in err, err[-3000:]
    assert rc == 5, verdict
    assert verdict.startswith("loadgen verdict: FAIL (exit 5): run incomplete: "), verdict
    info = _check_whole_record(results, served, accounting)
    assert info["status"] == "aborted"
    assert info["accounting"]["sessions_not_started"].get("stopped early", 0) > 0


def test_sigterm_to_the_master_alone_drains_and_exits_5(tmp_path) -> None:
    rc, results, _log, accounting, verdict, err, served = _sim_run(tmp_path, "master")
    assert "Traceback" not in err, err[-3000:]
    assert rc == 5, verdict
    assert "stopped by a signal (SIGTERM)" in verdict, verdict
    _check_whole_record(results, served, accounting)


def test_kill_9_of_the_front_still_ends_in_a_verdict_from_the_master(tmp_path) -> None:
    rc, results, _log, accounting, verdict, _err, served = _sim_run(tmp_path, "front-kill")
    assert rc == -signal.SIGKILL
    assert verdict.startswith("loadgen verdict: FAIL (exit 5): run incomplete: stopped by a signal (SIGTERM)"), verdict
    _check_whole_record(results, served, accounting)


def test_kill_9_of_the_master_is_exit_5_with_a_verdict_from_the_front(tmp_path) -> None:
    results, log = tmp_path / "results", tmp_path / "run.log"
    with sim(tmp_path, "--profile", "tiny", "--time-scale", "3", "--seed", "4") as (proc, _):
        p = _start(
            ["--target", proc.url, "--workload", "tiny", "--rate", "15", "--duration", "60s", "--seed", "4",
             "--results", str(results), "--max-schedule-lag", "60s"], log,
        )  # fmt: skip
        _wait_records(results, 5, p, log)
        (master,) = _children(p.pid)
        os.kill(master, signal.SIGKILL)
        rc = _finish(p)
    _, verdict, _ = _verdict(log)
    assert rc == 5
    assert verdict.startswith("loadgen verdict: FAIL (exit 5): run incomplete: the Locust master was killed by SIGKILL")
    run_dir = next(results.iterdir())
    assert orjson.loads((run_dir / "run.json").read_bytes())["status"] == "aborted"


def test_requests_still_on_the_wire_at_the_drain_deadline_are_recorded_as_cut(tmp_path) -> None:
    """A server that stops answering after the preflight: every request it received is on record
    as cut_at_stop (with what arrived), and the run says it is incomplete."""
    request_log = tmp_path / "requests.log"
    server = subprocess.Popen(
        [sys.executable, str(HOSTILE), "--log", str(request_log)], stdout=subprocess.PIPE, text=True
    )
    try:
        port = int(server.stdout.readline().split()[1])
        results, log = tmp_path / "results", tmp_path / "run.log"
        p = _start(
            ["--target", f"http://127.0.0.1:{port}/hang", "--workload", "tiny", "--rate", "3", "--duration", "2s",
             "--seed", "1", "--stop-timeout", "1s", "--results", str(results), "--max-schedule-lag", "60s"], log,
        )  # fmt: skip
        rc = _finish(p, timeout_s=60)
        received = [r for r in request_log.read_text().split() if not r.startswith("loadgen-preflight")]
    finally:
        server.kill()
        server.wait(timeout=5)
    accounting, verdict, _ = _verdict(log)
    assert rc == 5, verdict
    run_dir = next(results.iterdir())
    recs = records(run_dir)
    assert received and sorted(r.request_id for r in recs) == sorted(received)
    assert {r.error_category for r in recs} == {"cut_at_stop"}
    assert all(r.t_end_us is not None and r.t_end_us >= r.t_send_us for r in recs)
    assert f"{len(recs)} request" in verdict and "still on the wire when the stop's drain deadline passed" in verdict
    assert f"{len(recs)} requests sent: 0 ok, 0 failed, {len(recs)} cut at stop" in accounting
