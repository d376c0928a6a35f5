"""The run's clock starts once every worker holds its plan: loading a workload is never lag.

A worker used to get its plan with the run's start already fixed 0.2 s ahead, then spend the
workload's load time before its first arrival: a 12k-row trace made the first arrivals 765 ms
late, and the run was called generator-saturated. Now the worker loads the plan, measures the
target's connection set-up, says it is ready, and the master starts the clock after that.
"""

from __future__ import annotations

import json
import random
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import orjson
import pytest

from loadgen.engine.driver import MIN_SESSION_LEAD_NS, measure_connect_s, session_lead_ns

from .runs import loadgen, records, run_dir, sim

DELAY_PROXY = Path(__file__).resolve().parent.parent / "delay_proxy.py"


def _big_trace(path, rows: int = 40_000) -> None:
    rng = random.Random(1)
    t = 0
    with open(path, "w") as f:
        for i in range(rows):
            t += rng.randint(1, 20)  # ms: the first 30 arrivals come within ~0.3 s
            n = rng.randint(600, 1500)
            hashes = [i % 97, 1000 + i, 100_000 + i][: (n + 511) // 512]
            f.write(json.dumps({"timestamp": t, "input_length": n, "output_length": rng.randint(4, 16), "hash_ids": hashes}) + "\n")


def test_a_slow_to_load_trace_does_not_make_the_first_arrivals_late(tmp_path) -> None:
    trace = tmp_path / "big.jsonl"
    _big_trace(trace)
    results = tmp_path / "results"
    with sim(tmp_path, "--profile", "tiny", "--seed", "1") as (proc, _):
        r = loadgen(
            "run", "--target", proc.url, "--workload", str(trace), "--num-sessions", "30", "--seed", "1",
            "--results", str(results), "--max-schedule-lag", "60s",
        )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    d = run_dir(results)
    info = orjson.loads((d / "run.json").read_bytes())
    summary = orjson.loads((d / "summary.json").read_bytes())
    [worker] = info["workers"]
    prepare_s = worker["prepare_s"]
    assert prepare_s > 0.3, f"the trace loaded in {prepare_s} s: too quick to show anything"
    lag_p99_ms = summary["metrics"]["schedule_lag"]["p99"]
    # Before, every early arrival was late by about the load time; now by a small part of it.
    assert lag_p99_ms < prepare_s * 1000 / 4, (lag_p99_ms, prepare_s)
    assert info["accounting"]["sessions_started"] == 30


def test_the_session_lead_is_twice_the_measured_connection_set_up() -> None:
    assert session_lead_ns(None) == MIN_SESSION_LEAD_NS
    assert session_lead_ns(0.0001) == MIN_SESSION_LEAD_NS
    assert session_lead_ns(0.05) == 100_000_000  # a target 50 ms away: its connection opens 100 ms ahead
    assert session_lead_ns(5.0) == 2_000_000_000  # bounded


def test_connection_set_up_is_measured_against_the_target_and_none_when_unreachable() -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                c, _ = srv.accept()
                c.close()
            except OSError:
                pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        port = srv.getsockname()[1]
        connect_s = measure_connect_s(f"http://127.0.0.1:{port}", {})
        assert connect_s is not None and 0 < connect_s < 1.0
    finally:
        stop.set()
        t.join(timeout=2)
        srv.close()
    # Nobody listens there any more: no figure, and no long wait for one.
    assert measure_connect_s(f"http://127.0.0.1:{port}", {}) is None


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_a_far_https_target_does_not_make_first_turns_late(tmp_path) -> None:
    """Behind a 50 ms one-way delay a TLS connection takes ~100 ms to set up. Sessions used to
    open theirs 20 ms before the first turn, which then left ~80 ms late: schedule lag the
    generator did not owe. Now the worker measures the set-up and opens it twice as early."""
    from tests.integration.test_client_hostile import start_hostile
    from tests.integration.test_tls_targets import make_certificate

    cert, key = make_certificate(tmp_path)
    server, port = start_hostile("--tls", cert, key)
    proxy = subprocess.Popen([sys.executable, str(DELAY_PROXY), str(port), "50"], stdout=subprocess.PIPE, text=True)
    try:
        proxy_port = int(proxy.stdout.readline().split()[1])
        results = tmp_path / "results"
        r = loadgen(
            "run", "--target", f"https://127.0.0.1:{proxy_port}/ok", "--ca-cert", cert, "--workload", "tiny",
            "--rate", "4", "--num-sessions", "8", "--seed", "1", "--results", str(results),
            "--max-schedule-lag", "10s",
        )  # fmt: skip
    finally:
        proxy.kill()
        server.kill()
        proxy.wait(timeout=5)
        server.wait(timeout=5)
    assert r.returncode == 0, r.stderr[-3000:]
    d = run_dir(results)
    [worker] = orjson.loads((d / "run.json").read_bytes())["workers"]
    assert worker["connect_s"] >= 0.09, worker  # the handshake's round trip through the delay
    assert worker["session_lead_ms"] >= 2 * worker["connect_s"] * 1000 - 1
    first = [rec for rec in records(d) if rec.turn_index == 0]
    assert len(first) == 8
    worst_ms = max(rec.schedule_lag_us for rec in first) / 1000
    assert worst_ms < worker["connect_s"] * 1000 / 2, (worst_ms, worker)
