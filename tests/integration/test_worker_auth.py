"""Worker authentication: a master that holds a join secret gives slots, plans and a say in the
results only to workers that prove it (challenge-response), on real processes on 127.0.0.1."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import free_port

from .runs import LOADGEN, records, sim, truth
from .test_distributed_runs import H200, _master_args, _processes, _run_info, _worker_args

pytestmark = pytest.mark.slow

ROGUE = str(Path(__file__).with_name("rogue_worker.py"))


def _start(args: list[str], log: Path, **env: str | None) -> subprocess.Popen:
    full = {**os.environ, "PYTHONUNBUFFERED": "1"}
    full.pop("LOADGEN_JOIN_SECRET", None)
    full.update({k: v for k, v in env.items() if v is not None})
    return subprocess.Popen(args, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=full)


def test_a_master_with_a_secret_takes_only_the_worker_that_proves_it(tmp_path) -> None:
    port, results, run_id, n = free_port(), tmp_path / "results", "auth", 12
    secret_file = tmp_path / "join-secret"
    secret_file.write_text("correct horse battery staple\n")
    logs = {name: tmp_path / f"{name}.log" for name in ("master", "wrong", "none", "forger", "good")}
    with sim(tmp_path, *H200, "--seed", "1") as (proc, truth_log), _processes() as procs:
        args = _master_args(proc.url, port, results, run_id, 1, "--rate", "20", "--num-sessions", str(n))
        procs.append(_start([*LOADGEN, *args, "--join-secret-file", str(secret_file)], logs["master"]))
        # The unauthenticated ones connect first: Locust's own wait for one worker is then met
        # by them, and the master must still wait for one that proves the secret.
        procs.append(_start([*LOADGEN, *_worker_args(port)], logs["wrong"], LOADGEN_JOIN_SECRET="wrong"))
        procs.append(_start([*LOADGEN, *_worker_args(port)], logs["none"]))
        forger = [sys.executable, "-m", "locust", "-f", str(Path(__file__).with_name("rogue_worker.py")),
                  "--worker", "--master-host", "127.0.0.1", "--master-port", str(port)]  # fmt: skip
        procs.append(_start(forger, logs["forger"], ROGUE_RUN_ID=run_id))
        time.sleep(3.0)
        procs.append(_start([*LOADGEN, *_worker_args(port), "--join-secret-file", str(secret_file)], logs["good"]))
        code = procs[0].wait(timeout=90)
        # The refused workers are told to quit with the master (they would wait for it forever):
        # a wait that times out fails the test.
        for refused in procs[1:3]:
            refused.wait(timeout=20)
        out = {name: log.read_text() for name, log in logs.items()}
        assert code == 0, out["master"][-3000:]
    info = _run_info(results / run_id)
    recs = records(results / run_id)

    [worker] = info["workers"]
    assert worker["authenticated"] is True and worker["slot"] == 0
    assert worker["host"] and worker["id"].startswith(worker["host"] + "_")
    assert info["worker_auth"] == {"join_secret_required": True, "allow_unauthenticated_workers": False}
    # Every recorded request is the verified worker's, none the forger's; every session ran once.
    assert {r.worker for r in recs} == {worker["id"]}
    assert sorted({r.session_index for r in recs}) == list(range(n))
    assert all(not r.request_id.endswith("-9999-0") for r in recs)
    served = {rid for rid in truth(truth_log) if rid.startswith(f"{run_id}-")}
    assert {r.request_id for r in recs} == served
    assert info["requests_recorded"] == len(recs)
    # The refused workers were told so and got no plan; the master logged each of them.
    for name in ("wrong", "none"):
        assert "the master refused this worker" in out[name], out[name][-2000:]
    assert "ROGUE: denied" in out["forger"]
    assert "ROGUE: got a plan" not in out["forger"] and "ROGUE: got go" not in out["forger"]
    # Nothing else reached the forger either: not Locust's spawn (the master's options, the target
    # URL, the rate), not a heartbeat answer; only the challenge, the refusal and, as the master
    # quit, Locust's quit. It was listening from before the challenge came, so the check sees
    # every message it got.
    received = {line.split("ROGUE: received ", 1)[1].strip() for line in out["forger"].splitlines() if "ROGUE: received " in line}
    assert "loadgen_challenge" in received, out["forger"][-2000:]
    assert received <= {"loadgen_challenge", "loadgen_denied", "quit"}, received
    assert proc.url not in out["forger"]
    assert out["master"].count("refused: it answered with a wrong join secret") == 2, out["master"][-3000:]  # wrong, forger
    assert out["master"].count("refused: it answered with no join secret") == 1
    ignored = [line for line in out["master"].splitlines() if "unauthenticated worker" in line and "ignored" in line]
    assert len(ignored) == 1, out["master"][-3000:]  # the forger's messages, logged once
    assert "correct horse" not in "".join(out.values())


def test_a_loopback_master_without_a_secret_takes_any_worker_unauthenticated(tmp_path) -> None:
    port, results, run_id = free_port(), tmp_path / "results", "open"
    with sim(tmp_path, *H200, "--seed", "1") as (proc, _), _processes() as procs:
        args = _master_args(proc.url, port, results, run_id, 1, "--rate", "20", "--num-sessions", "4")
        procs.append(_start([*LOADGEN, *args], tmp_path / "master.log"))
        procs.append(_start([*LOADGEN, *_worker_args(port)], tmp_path / "worker.log"))
        assert procs[0].wait(timeout=60) == 0, (tmp_path / "master.log").read_text()[-3000:]
    info = _run_info(results / run_id)
    [worker] = info["workers"]
    assert worker["authenticated"] is False
    assert info["worker_auth"]["join_secret_required"] is False
    assert len(records(results / run_id)) > 0


def test_allow_unauthenticated_workers_off_loopback_says_so_on_start_and_in_run_json(tmp_path) -> None:
    port, results, run_id = free_port(), tmp_path / "results", "allow"
    with sim(tmp_path, *H200, "--seed", "1") as (proc, _), _processes() as procs:
        args = _master_args(proc.url, port, results, run_id, 1, "--rate", "20", "--num-sessions", "4")
        args += ["--bind", "0.0.0.0", "--allow-unauthenticated-workers"]
        procs.append(_start([*LOADGEN, *args], tmp_path / "master.log"))
        procs.append(_start([*LOADGEN, *_worker_args(port)], tmp_path / "worker.log"))
        assert procs[0].wait(timeout=60) == 0, (tmp_path / "master.log").read_text()[-3000:]
        out = (tmp_path / "master.log").read_text()
    warnings = [line for line in out.splitlines() if line.startswith("warning: --allow-unauthenticated-workers")]
    assert len(warnings) == 1, out[-3000:]
    info = _run_info(results / run_id)
    assert info["worker_auth"] == {"join_secret_required": False, "allow_unauthenticated_workers": True}
    assert any("allow-unauthenticated-workers" in w for w in info["warnings"])
    [worker] = info["workers"]
    assert worker["authenticated"] is False
    assert "joined (no join secret required)" in out  # off loopback, every join is logged by default
    # The address its messages came from (the connection's peer), beside the host it claims.
    assert worker["address"] == "127.0.0.1"
    assert f"worker {worker['id']} (host {worker['host']}, address 127.0.0.1) joined" in out, out[-3000:]
