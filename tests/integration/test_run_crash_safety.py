"""A `loadgen run` killed with SIGKILL halfway keeps what it recorded and leaves nothing running."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import orjson
import pytest

from .runs import LOADGEN, loadgen, records, sim, truth

pytestmark = pytest.mark.slow


def _start(args: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [*LOADGEN, *args],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _wait_for_records(results: Path, n: int, timeout_s: float) -> Path:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        for d in results.glob("*/requests.jsonl"):
            if d.stat().st_size and len(d.read_bytes().splitlines()) >= n:
                return d.parent
        time.sleep(0.2)
    raise AssertionError(f"fewer than {n} records after {timeout_s} s")


def _descendants(pid: int) -> set[int]:
    out, frontier = set(), {pid}
    while frontier:
        nxt = set()
        for p in Path("/proc").iterdir():
            if not p.name.isdigit():
                continue
            try:
                ppid = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid in frontier:
                nxt.add(int(p.name))
        out |= nxt
        frontier = nxt
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_kill_9_keeps_every_request_finished_a_second_before(tmp_path) -> None:
    results = tmp_path / "results"
    with sim(tmp_path, "--profile", "tiny", "--time-scale", "3", "--seed", "2") as (proc, truth_log):
        p = _start(
            ["run", "--target", proc.url, "--workload", "tiny", "--rate", "15", "--duration", "60s",
             "--seed", "2", "--results", str(results)],
            tmp_path / "run.log",
        )  # fmt: skip
        try:
            run_dir = _wait_for_records(results, 40, timeout_s=60)
            time.sleep(1.5)
            family = _descendants(p.pid)
            t_kill_ns = time.perf_counter_ns()  # same monotonic clock as the sim's truth
            p.send_signal(signal.SIGKILL)
            p.wait(timeout=10)
        finally:
            if p.poll() is None:
                p.kill()
        # Locust's master and worker die with it: no load after the kill.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_alive(pid) for pid in family):
            time.sleep(0.1)
        assert not [pid for pid in family if _alive(pid)]
        time.sleep(0.5)
        sent_after = [t for t in truth(truth_log).values() if t["t_received_ns"] > t_kill_ns + 500_000_000]
        assert not sent_after, f"{len(sent_after)} requests reached the server after the kill"

    recorded = {r.request_id for r in records(run_dir)}
    finished_before = {
        rid
        for rid, t in truth(truth_log).items()
        if t["outcome"] == "ok" and t["t_end_ns"] < t_kill_ns - 1_000_000_000 and not rid.startswith("loadgen-preflight")
    }
    assert len(finished_before) >= 30
    missing = finished_before - recorded
    assert not missing, f"{len(missing)} requests finished > 1 s before the kill are missing"

    info = orjson.loads((run_dir / "run.json").read_bytes())
    # Locust got SIGTERM as its parent died and closed the run; it never reached its planned end.
    assert info["status"] in ("running", "aborted"), info["status"]
    r = loadgen("report", str(run_dir))
    assert r.returncode == 0, r.stderr
    assert "partial" in r.stdout.lower()
    summary = orjson.loads((run_dir / "summary.json").read_bytes())
    assert summary["partial"] is True
    assert summary["requests"]["measured"] == len(recorded)


def test_kill_9_leaves_no_embedded_sim_on_its_port(tmp_path) -> None:
    results = tmp_path / "results"
    p = _start(
        ["run", "--workload", "tiny", "--profile", "tiny", "--rate", "10", "--duration", "60s", "--results", str(results)],
        tmp_path / "run.log",
    )
    try:
        run_dir = _wait_for_records(results, 10, timeout_s=60)
        family = _descendants(p.pid)
        sims = [pid for pid in family if b"targets.sim" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        assert sims, "the embedded sim should be a child of loadgen run"
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=10)
    finally:
        if p.poll() is None:
            p.kill()
    url = orjson.loads((run_dir / "run.json").read_bytes())["targets"][0]["url"]
    port = int(url.rsplit(":", 1)[1])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(pid) for pid in family):
        time.sleep(0.1)
    assert not [pid for pid in family if _alive(pid)], "processes outlived loadgen run"
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))  # the port is free again

