"""A replica killed (SIGKILL) in the middle of `loadgen run --replicas 2 --router ...`.

What the records show, with both routers' default retries (docs/routers.md): the streams that
were on the killed replica break off (`stream_cut`, counted as such); the requests the router
then sends to the dead replica fail there and are retried on the live one, so the client never
sees them fail; the router's own counters show those retries and the circuit breaker opening.
The run goes on to the last session with the surviving replica and exits 1 (request failures).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request

import orjson
import pytest

from .runs import LOADGEN, records

pytestmark = pytest.mark.slow

SESSIONS = 24
TURNS = 3
WORKLOAD = f"""\
name: long-replies
system_prompt_tokens: 10
turns: {TURNS}
first_user_tokens: 100
user_tokens: 20
output_tokens: 100
think_time: 10ms
"""
# The router's counters of retried requests and of circuit-breaker transitions.
RETRIES = {"sglang": "smg_worker_retries_total", "vllm": "vllm_router_retries_total"}
BREAKER = {"sglang": "smg_worker_cb_transitions_total", "vllm": "vllm_router_cb_state_transitions_total"}


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read()


def _wait_for(what: str, check, timeout_s: float = 60.0, proc: subprocess.Popen | None = None):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        value = check()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            pytest.fail(
                f"loadgen exited ({proc.returncode}) while waiting for {what}: {proc.stdout.read()[-3000:]}"
            )
        time.sleep(0.02)
    pytest.fail(f"timed out waiting for {what}")


def _running(replica_url: str) -> float:
    for line in _get(f"{replica_url}/metrics").decode().splitlines():
        if line.startswith("sim:num_requests_running"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
def test_a_replica_killed_mid_run_cuts_its_streams_and_the_run_goes_on(kind, tmp_path):
    wl = tmp_path / "long-replies.yaml"
    wl.write_text(WORKLOAD)
    results = tmp_path / "results"
    d = results / "loss"
    proc = subprocess.Popen(
        [
            *LOADGEN, "run", "--replicas", "2", "--router", f"{kind}:round_robin", "--profile", "tiny",
            "--time-scale", "4", "--workload", str(wl), "--concurrency", "4",
            "--num-sessions", str(SESSIONS), "--seed", "9", "--results", str(results), "--run-id", "loss",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        run = _wait_for(
            "run.json",
            lambda: (d / "run.json").exists() and orjson.loads((d / "run.json").read_bytes()),
            proc=proc,
        )
        victim = run["targets"][0]["fleet"]["replicas"][1]
        info = json.loads(_get(f"{victim['url']}/sim/info"))
        assert info["server_id"] == victim["server_id"] == "replica-1"
        # Some turns done, and a reply streaming from the victim right now: kill it mid-stream.
        _wait_for(
            "8 records",
            lambda: (
                (d / "requests.jsonl").exists() and len((d / "requests.jsonl").read_bytes().splitlines()) >= 8
            ),
            proc=proc,
        )
        _wait_for("a request running on replica-1", lambda: _running(victim["url"]) >= 1, proc=proc)
        killed_at_s = time.time() - run["t0_unix_s"]
        os.kill(info["pid"], signal.SIGKILL)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    assert proc.returncode == 1, out[-3000:]
    run = orjson.loads((d / "run.json").read_bytes())
    summary = orjson.loads((d / "summary.json").read_bytes())
    assert run["status"] == "complete"
    recs = records(d)
    failed = [r for r in recs if not r.ok]
    by_category: dict[str, int] = {}
    for r in failed:
        by_category[r.error_category] = by_category.get(r.error_category, 0) + 1
    # Counted by category, in the summary and in the verdict line.
    assert summary["errors"]["by_category"] == by_category
    assert by_category.get("stream_cut", 0) >= 1 and set(by_category) <= {
        "stream_cut",
        "connection",
        "http_5xx",
    }
    assert f"{len(failed)} of {len(recs)} requests failed" in out
    for r in failed:
        if r.error_category == "stream_cut":
            assert 0 < r.output_tokens < r.max_tokens and r.http_status == 200

    # The run went on: every session started and most turns after the kill succeeded, all of
    # them on the surviving replica.
    assert {r.session_id for r in recs} == {f"s9-{i:06d}" for i in range(SESSIONS)}
    after = [r for r in recs if r.ok and r.t_send_us / 1e6 > killed_at_s + 0.5]
    assert len(after) >= 10, (killed_at_s, len(after))
    metrics = orjson.loads((d / "server-metrics.json").read_bytes())
    assert metrics["replica-1"]["note"] == "no /metrics page could be read"
    served = sum(v for k, v in metrics["replica-0"]["counters"].items() if k.startswith("sim:requests_total"))
    assert served >= len(after)

    # The router retried what it sent to the dead replica, and its circuit breaker opened.
    router = metrics["router"]["counters"]
    assert sum(v for k, v in router.items() if k.startswith(RETRIES[kind])) >= 1, router
    opened = [k for k in router if k.startswith(BREAKER[kind]) and 'to="open"' in k]
    assert opened and victim["url"] in opened[0], router
