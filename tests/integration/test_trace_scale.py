"""A million-row trace replayed without any process holding it: memory and start stay those of a
small file (real sim, real Locust master and two workers).

Read whole, this trace took ~14 s and ~1 GB in each process (the front, the master and every
worker) before the first request. Streamed (``loadgen.engine.plan_stream``), each process reads the rows
it needs as they come due.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import socket
import subprocess
from datetime import datetime
from pathlib import Path

import pytest

from tests.integration.runs import LOADGEN, records, run_dir, sim, truth
from workloads import load_workload
from workloads.loader import is_streamed_file

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("trace_scale", REPO / "bench" / "trace_scale.py")
assert _spec is not None and _spec.loader is not None
trace_scale = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(trace_scale)

ROWS = 1_000_000
SESSIONS = 60
SCALE = 0.5
# Bounds with room for a busy machine: streamed, each process peaks at ~80-110 MB (Python,
# Locust, gevent, numpy); the whole-file read needed ~1 GB each.
PEAK_RSS_MB = 250
FIRST_REQUEST_S = 2.0  # after the run's start t0 (run.json t0_unix_s; every record's clock)
PLAN_LOAD_S = 2.0  # a worker's plan arriving -> ready (run.json workers[].prepare_s); whole: ~14 s


def first_offsets(path: Path, n: int) -> list[float]:
    with open(path, newline="") as f:
        rows = csv.reader(f)
        next(rows)
        stamps = [datetime.fromisoformat(next(rows)[0]) for _ in range(n)]
    return [(t - stamps[0]).total_seconds() for t in stamps]


@pytest.mark.slow
def test_a_million_row_trace_starts_at_once_and_no_process_holds_it(tmp_path):
    trace = tmp_path / "azure.csv"
    trace_scale.write_azure_trace(trace, ROWS)
    results = tmp_path / "results"
    with sim(tmp_path, "--profile", "h200-llama3-8b-fp8", "--time-scale", "0") as (proc, truth_log):
        cmd = [
            *LOADGEN, "run", "--target", proc.url, "--workload", str(trace), "--num-sessions", str(SESSIONS),
            "--trace-time-scale", str(SCALE), "--workers", "2", "--max-schedule-lag", "1s", "--results", str(results),
        ]  # fmt: skip
        run = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        with trace_scale.TreePeaks(run.pid) as peaks:
            out, _ = run.communicate(timeout=180)
    assert run.returncode == 0, out[-3000:]
    d = run_dir(results)
    info = json.loads((d / "run.json").read_text())

    # Every process of the run stayed small the whole time (VmHWM: the kernel's own peak).
    assert set(peaks.peak_kb) == {"front", "master", "worker-1", "worker-2"}, peaks.peak_kb
    assert all(kb / 1024 < PEAK_RSS_MB for kb in peaks.peak_kb.values()), peaks.peak_kb

    # The first request left at once after the start, and the workers' plans loaded at once.
    recs = sorted(records(d), key=lambda r: r.session_index)
    assert min(r.t_send_us for r in recs) / 1e6 < FIRST_REQUEST_S
    assert all(w["prepare_s"] < PLAN_LOAD_S for w in info["workers"]), info["workers"]

    # The file's bytes were hashed during the run, and run.json got the fingerprint.
    assert info["workload"]["fingerprint"] == load_workload(trace, stream=True).fingerprint()

    # What was replayed is the trace's first SESSIONS rows, at their times, each sent once.
    acc = info["accounting"]
    assert (acc["arrivals_planned"], acc["sessions_started"], acc["schedule_cut_by"]) == (SESSIONS, SESSIONS, ["--num-sessions"])
    assert [r.session_index for r in recs] == list(range(SESSIONS)) and all(r.ok for r in recs)
    assert [r.session_id for r in recs] == [f"azure-L{k + 2}" for k in range(SESSIONS)]
    want = [t * SCALE for t in first_offsets(trace, SESSIONS)]
    got = [r.t_sched_us / 1e6 for r in recs]
    assert all(abs(g - got[0] - w) <= 2e-6 for g, w in zip(got, want, strict=True))
    served = truth(truth_log)
    assert {r.request_id for r in recs} <= set(served) and len({r.worker for r in recs}) == 2


def test_a_worker_without_the_trace_pulls_it_from_the_master_in_chunks(tmp_path):
    """The workload is a path relative to the master's directory, which the worker's lacks: the
    worker pulls the file (loadgen.runtime.file_ship) and replays the same sessions."""
    master_dir, worker_dir = tmp_path / "m", tmp_path / "w"
    master_dir.mkdir()
    worker_dir.mkdir()
    trace = master_dir / "azure.csv"
    trace_scale.write_azure_trace(trace, 270_000)  # just over the 8 MiB a trace is streamed from
    assert is_streamed_file(trace)
    results = tmp_path / "results"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with sim(tmp_path, "--profile", "h200-llama3-8b-fp8", "--time-scale", "0") as (proc, _), socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
        s.close()
        master = subprocess.Popen(
            [*LOADGEN, "master", "--headless", "--expect-workers", "1", "--master-port", port, "--target", proc.url,
             "--workload", "azure.csv", "--num-sessions", "20", "--trace-time-scale", str(SCALE),
             "--max-schedule-lag", "1s", "--results", str(results)],
            cwd=master_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        worker = subprocess.run(
            [*LOADGEN, "worker", "--master-host", "127.0.0.1", "--master-port", port],
            cwd=worker_dir, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        out, _ = master.communicate(timeout=60)
    assert master.returncode == 0, out[-3000:] + worker.stderr[-3000:]
    assert "azure.csv is not on this host: pulled it from the master (8.6 MiB" in worker.stderr, worker.stderr[-3000:]
    recs = sorted(records(run_dir(results)), key=lambda r: r.session_index)
    assert [r.session_id for r in recs] == [f"azure-L{k + 2}" for k in range(20)] and all(r.ok for r in recs)
