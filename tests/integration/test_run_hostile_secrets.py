"""One `loadgen run` against a hostile https server, watched from outside while it runs.

The server (tests/hostile_server.py ``mixed``, TLS with a self-signed certificate, so the run uses
--insecure) answers each request by a stable function of its request id: served, throttled once
with Retry-After, stalled mid-stream, silent after its headers, slowloris headers, or HTTP 500;
and it refuses any request without the API key. So every record is checked against what the
server did to it: the category, the throttle count, and the summary's split of server faults
from client errors. Meanwhile every process of the run is watched (/proc through psutil): no
command line carries the key, and every listening socket is on 127.0.0.1. Afterwards no file of
the results and no line of output carries it either, and run.json records the --insecure warning.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import threading
import time
import urllib.request
from collections import Counter

import orjson
import psutil
import pytest

from tests.conftest import free_port
from tests.hostile_server import mixed_behaviour
from tests.integration.runs import LOADGEN, records
from tests.integration.test_client_hostile import start_hostile
from tests.integration.test_tls_targets import make_certificate

pytestmark = pytest.mark.slow  # one real run: about 10 s on 2 shared cores

WEB_PAGES = ("/", "/stats/requests", "/loadgen/live.json", "/loadgen/charts", "/stats/report")
SESSIONS = 24
RUN_ID = "hostile"
KEY_ENV = "LOADGEN_TEST_API_KEY"
EXPECTED = {  # mixed behaviour -> (category, throttled) of the record
    "ok": (None, 0),
    "throttle": (None, 1),
    "stall": ("timeout", 0),
    "silence": ("timeout", 0),
    "slowloris": ("timeout", 0),
    "fail": ("http_5xx", 0),
}


def _watch(root: psutil.Process, seen: dict, stop: threading.Event) -> None:
    """Every 50 ms: the command line, title and listening sockets of every process of the run."""
    while not stop.is_set():
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            break
        for p in procs:
            try:
                seen["cmdlines"].add((p.pid, " ".join(p.cmdline()), p.name()))
                for c in p.net_connections(kind="inet"):
                    if c.status == psutil.CONN_LISTEN:
                        seen["listening"].add((p.pid, c.laddr.ip, c.laddr.port))
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        stop.wait(0.05)


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile-run")
    key = "sk-loadgen-" + secrets.token_hex(16)
    env = {**os.environ, KEY_ENV: key, "PYTHONUNBUFFERED": "1"}
    cert, pem_key = make_certificate(tmp)
    os.environ[KEY_ENV] = key  # the server reads it from its environment too
    try:
        server, port = start_hostile("--tls", cert, pem_key, "--require-key-env", KEY_ENV)
    finally:
        del os.environ[KEY_ENV]
    workload = tmp / "sessions.jsonl"
    workload.write_text(
        "\n".join(
            json.dumps({"id": f"s{i}", "turns": [{"content": "hi", "max_tokens": 4}, {"content": "go", "max_tokens": 4}]})
            for i in range(SESSIONS)
        )
    )
    results = tmp / "results"
    cmd = [
        *LOADGEN, "run", "--target", f"https://127.0.0.1:{port}/mixed", "--insecure",
        "--api-key-env", KEY_ENV, "--workload", str(workload), "--num-sessions", str(SESSIONS),
        "--arrival", "constant", "--rate", "40", "--request-timeout", "5s", "--stop-timeout", "3s",
        "--first-byte-timeout", "0.5s", "--idle-timeout", "0.4s", "--retry-after-cap", "1s",
        "--results", str(results), "--run-id", RUN_ID,
        # Not a test of the generator's health: on 2 shared cores Locust's own start-up can hold
        # the worker's loop for a second, and exit 4 (saturated) would mask exit 1.
        "--max-schedule-lag", "60s",
    ]  # fmt: skip
    web_port = free_port()
    cmd += ["--web", "--autostart", "--web-port", str(web_port)]  # the web UI stays up after the run: pages read then
    seen: dict = {"cmdlines": set(), "listening": set()}
    stop = threading.Event()
    t0 = time.monotonic()
    out_path, err_path = tmp / "stdout.txt", tmp / "stderr.txt"
    with out_path.open("w") as out, err_path.open("w") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env)
    watcher = threading.Thread(target=_watch, args=(psutil.Process(proc.pid), seen, stop), daemon=True)
    watcher.start()
    pages: dict[str, bytes] = {}
    try:
        run_json = results / RUN_ID / "run.json"
        deadline = time.monotonic() + 60
        while not (run_json.exists() and orjson.loads(run_json.read_bytes()).get("status") != "running"):
            assert proc.poll() is None and time.monotonic() < deadline, err_path.read_text()[-3000:]
            time.sleep(0.1)
        seconds = time.monotonic() - t0
        for path in WEB_PAGES:
            with urllib.request.urlopen(f"http://127.0.0.1:{web_port}{path}", timeout=10) as r:
                pages[path] = r.read()
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    finally:
        stop.set()
        if proc.poll() is None:
            proc.kill()
        server.kill()
        server.wait(timeout=5)
    watcher.join(timeout=5)
    return {
        "rc": proc.returncode, "stdout": out_path.read_text(), "stderr": err_path.read_text(),
        "seconds": seconds, "dir": results / RUN_ID, "key": key, "seen": seen, "pages": pages,
        "web_port": web_port,
    }  # fmt: skip


def test_every_fault_ends_as_its_category_and_the_run_as_failed_requests(hostile_run):
    run = hostile_run
    assert run["rc"] == 1, (run["rc"], run["stderr"][-3000:])  # request failures, not a crash
    recs = records(run["dir"])
    seen = {mixed_behaviour(r.request_id)[0] for r in recs}
    assert seen == set(EXPECTED), seen  # the id hash spread the sessions over every behaviour
    for r in recs:
        category, throttled = EXPECTED[mixed_behaviour(r.request_id)[0]]
        assert (r.error_category, r.throttled) == (category, throttled), (r.request_id, r.error_message)
        if r.ok:
            assert r.output_tokens == 4 and r.usage_completion_tokens == 4
    # A failed first turn ends its session; a served one goes on to the second turn.
    assert len(recs) == SESSIONS + sum(1 for r in recs if r.turn_index == 0 and r.ok)


def test_summary_separates_server_faults_client_errors_and_throttling(hostile_run):
    recs = records(hostile_run["dir"])
    summary = orjson.loads((hostile_run["dir"] / "summary.json").read_bytes())
    errors = summary["errors"]
    failed = [r for r in recs if not r.ok]
    assert errors["total"] == len(failed) and errors["server_faults"] == len(failed)
    assert errors["client_errors"] == 0
    assert errors["throttled_retries"] == sum(r.throttled for r in recs) > 0
    assert errors["by_category"] == dict(Counter(r.error_category for r in failed))
    assert set(errors["by_category"]) == {"http_5xx", "timeout"}
    out = hostile_run["stdout"] + hostile_run["stderr"]
    assert f"server faults {len(failed)}  client errors 0" in out
    assert f"throttled   {errors['throttled_retries']} retries after 429 + Retry-After (not failures)" in out


def test_insecure_tls_is_recorded_as_a_warning(hostile_run):
    from targets.tls import INSECURE_WARNING

    run_json = orjson.loads((hostile_run["dir"] / "run.json").read_bytes())
    assert run_json["warnings"] == [INSECURE_WARNING]
    assert run_json["targets"][0]["tls"] == {"ca_cert": None, "verified": False}
    assert run_json["config"]["insecure_tls"] is True
    assert f"warning: {INSECURE_WARNING}" in hostile_run["stderr"]


def test_the_api_key_is_in_no_file_output_or_command_line(hostile_run):
    key = hostile_run["key"]
    files = [p for p in hostile_run["dir"].rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"run.json", "requests.jsonl", "summary.json", "metrics.hlog"}
    for p in files:
        assert key.encode() not in p.read_bytes(), p
    assert key not in hostile_run["stdout"] and key not in hostile_run["stderr"]
    assert set(hostile_run["pages"]) == set(WEB_PAGES)
    assert b"LOADGEN_TEST_API_KEY" in hostile_run["pages"]["/"]  # the form shows the option's value
    for path, page in hostile_run["pages"].items():
        assert key.encode() not in page, path
    cmdlines = hostile_run["seen"]["cmdlines"]
    assert any("locust" in c for _, c, _ in cmdlines)  # the watcher saw the master and worker
    for pid, cmdline, title in cmdlines:
        assert key not in cmdline and key not in title, pid


def test_every_listening_socket_of_the_run_is_on_loopback(hostile_run):
    listening = hostile_run["seen"]["listening"]
    assert hostile_run["web_port"] in {port for _, _, port in listening}  # the watcher saw the web UI
    assert len(listening) >= 2  # and the Locust master's port
    assert {ip for _, ip, _ in listening} == {"127.0.0.1"}, listening


def test_the_run_ended_by_its_deadlines(hostile_run):
    # 24 sessions at 40/s, every fault bounded by 0.5 s, 0.4 s or one 0.2 s throttle wait: the
    # run's own time is start-up plus about two seconds, far under the server's 30 s holds.
    assert hostile_run["seconds"] < 25, hostile_run["seconds"]
