"""Ctrl-C in a terminal stops a `loadgen run` once, cleanly, with every request it sent recorded.

A terminal's Ctrl-C sends SIGINT to the whole process group: the `loadgen run` front, Locust's
master and its workers. Only the front acts on it (it asks the master to stop: see
loadgen/runtime/stop_request.py); the master and workers ignore SIGINT, so no KeyboardInterrupt lands in
the middle of a handler. The run drains what is on the wire and ends with one verdict, last.
The run's processes are checked on the way: the master below its workers' priority.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import orjson
import psutil

from loadgen.runtime.master_priority import MASTER_NICE

from .runs import LOADGEN, records, sim, truth


def test_ctrl_c_to_the_process_group_stops_the_run_once_and_loses_nothing(tmp_path) -> None:
    results = tmp_path / "results"
    log = tmp_path / "run.log"
    with sim(tmp_path, "--profile", "tiny", "--time-scale", "3", "--seed", "4") as (proc, truth_log):
        p = subprocess.Popen(
            [*LOADGEN, "run", "--target", proc.url, "--workload", "tiny", "--rate", "15", "--duration", "60s",
             "--seed", "4", "--results", str(results), "--max-schedule-lag", "60s"],
            stdout=subprocess.DEVNULL, stderr=log.open("wb"), start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while not any(len(f.read_bytes().splitlines()) >= 10 for f in results.glob("*/requests.jsonl")):
                assert p.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
                time.sleep(0.1)
            # Under load the master runs at nice +5 and its workers as the run was started: where
            # they share a core, a worker is not held off its tokens by the master's bursts.
            front = psutil.Process(p.pid)
            (master,) = front.children()
            workers = master.children()
            assert workers and master.nice() == front.nice() + MASTER_NICE
            assert all(w.nice() == front.nice() for w in workers)
            t_stop = time.monotonic()
            os.killpg(p.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
            rc = p.wait(timeout=40)
            stopped_s = time.monotonic() - t_stop
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        served = {rid for rid in truth(truth_log) if not rid.startswith("loadgen-preflight")}

    err = log.read_text()
    lines = [line for line in err.splitlines() if line.strip()]
    verdicts = [line for line in lines if line.startswith("loadgen verdict:")]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert len(verdicts) == 1 and lines[-1] == verdicts[0], err[-2000:]
    assert rc == (0 if "PASS" in verdicts[0] else int(verdicts[0].split("exit ")[1].split(")")[0])), verdicts[0]
    assert stopped_s < 35  # the drain's deadline (--stop-timeout 30s) and the shutdown

    run_dir = next(results.iterdir())
    info = orjson.loads((run_dir / "run.json").read_bytes())
    assert info["status"] == "aborted" and "before its planned end" in info["abort_reason"]
    # Every request the server saw is recorded: what was on the wire drained or was cut, on record.
    recorded = {r.request_id for r in records(run_dir)}
    assert served and served <= recorded, f"{len(served - recorded)} of {len(served)} requests unrecorded"
