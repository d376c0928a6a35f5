"""The whole fleet: start_fleet, and `python -m targets.fleet` (= `loadgen serve fleet`) as a user runs it.

No process may outlive the fleet: after stop(), SIGINT, SIGTERM, or a SIGKILL of its parent.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from targets.fleet import FleetError, start_fleet
from targets.fleet.procs import http_get, process_title
from targets.fleet.routers import start_router

PROFILE = "tiny"


def children_of(pid: int) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(entry.name))
    return found


def all_gone(pids: list[int], within_s: float = 5.0) -> list[int]:
    """The pids still alive (not zombies) after ``within_s``; empty when all are gone."""
    deadline = time.monotonic() + within_s
    while True:
        alive = []
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                        alive.append(pid)
            except FileNotFoundError:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def test_start_fleet_gives_urls_identity_and_cleans_up(tmp_path):
    with start_fleet(
        replicas=2, profile=PROFILE, time_scale=1.0, seed=5, router="vllm:consistent_hash", log_dir=tmp_path
    ) as fleet:
        pids = [p.pid for p in fleet.processes()]
        assert len(pids) == 3
        assert fleet.url == fleet.router.url != fleet.replica_urls[0]
        assert len(fleet.replica_urls) == 2 and all(
            u.startswith("http://127.0.0.1:") for u in fleet.replica_urls
        )
        ident = fleet.router_identity
        assert (ident.name, ident.version, ident.policy) == ("vllm-router", "0.1.17", "consistent_hash")
        assert ident.worker_urls == tuple(fleet.replica_urls)
        assert fleet.session_header == "X-Session-ID"
        assert [r.server_id for r in fleet.replicas] == ["replica-0", "replica-1"]
        assert [r.info["seed"] for r in fleet.replicas] == [r.seed for r in fleet.replicas]
        assert fleet.describe()["router"]["policy"] == "consistent_hash"
        assert fleet.summary_line() == (
            "vllm-router 0.1.17 (policy consistent_hash, session header X-Session-ID, affinity header) "
            "in front of 2 sim replicas"
        )
        assert http_get(f"{fleet.url}/v1/models")[0] == 200
        fleet.verify()
    assert all_gone(pids) == []
    assert (tmp_path / "sim-0.log").exists()


def test_one_replica_without_a_router_is_served_directly(tmp_path):
    with start_fleet(replicas=1, profile=PROFILE, router="none", log_dir=tmp_path) as fleet:
        assert fleet.router is None and fleet.router_identity is None and fleet.session_header is None
        assert fleet.url == fleet.replica_urls[0]
        assert http_get(f"{fleet.url}/health")[0] == 200
        assert fleet.summary_line() == "1 sim replica, no router"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"replicas": 2, "router": "none"},
         "--replicas 2 needs a router to share one URL; use e.g. --router sglang:round_robin"),
        ({"router": "haproxy:leastconn"},
         "unknown router 'haproxy' in 'haproxy:leastconn'; choose one of: sglang:<policy>, vllm:<policy>, none"),
        ({"router": "vllm:manual"},
         "unknown policy 'manual' for vllm-router; choose one of: cache_aware, consistent_hash, power_of_two, "
         "random, round_robin, sticky_least_loaded"),
        ({"profile": "no-such-gpu"}, "unknown sim profile 'no-such-gpu'; choose one of: "),
        ({"replicas": 0}, "--replicas must be a whole number >= 1 (got 0)"),
        ({"engine": "trtllm"}, "unknown engine 'trtllm'; choose one of: sim, llama-server"),
        ({"time_scale": -1}, "--time-scale must be a number >= 0 (got -1); 0.1 runs ten times faster, 0 flat out"),
    ],
)  # fmt: skip
def test_bad_input_fails_before_anything_starts(kwargs, message, tmp_path):
    before = children_of(os.getpid())
    with pytest.raises(FleetError) as e:
        start_fleet(**{"profile": PROFILE, "log_dir": tmp_path, **kwargs})
    assert str(e.value).startswith(message)
    assert children_of(os.getpid()) == before


def test_a_replica_past_its_startup_deadline_fails_and_nothing_is_left(tmp_path):
    before = children_of(os.getpid())
    with pytest.raises(FleetError, match=r"^sim-0 \(pid \d+\) printed no address within 0.01s; log tail \("):
        start_fleet(
            replicas=2, profile=PROFILE, router="sglang:round_robin", log_dir=tmp_path, startup_timeout_s=0.01
        )
    assert children_of(os.getpid()) == before


def test_a_stale_router_on_the_router_port_is_refused_before_replicas_start(tmp_path):
    with start_fleet(replicas=1, profile=PROFILE, router="none", log_dir=tmp_path / "a") as old:
        stale = start_router("sglang:round_robin", old.replica_urls, log_dir=tmp_path / "a")
        try:
            port = int(stale.url.rsplit(":", 1)[1])
            before = children_of(os.getpid())
            with pytest.raises(FleetError) as e:
                start_fleet(replicas=2, profile=PROFILE, router="sglang:cache_aware", router_port=port,
                            log_dir=tmp_path / "b")  # fmt: skip
            assert str(e.value) == (
                f"sglang-router port {port} on 127.0.0.1 is already in use by pid {stale.process.pid} "
                "(sglang::router); stop it or choose another port"
            )
            assert children_of(os.getpid()) == before
        finally:
            stale.stop()


def serve(*args: str) -> tuple[subprocess.Popen, list[str], list[int]]:
    """Run ``python -m targets.fleet ARGS`` until it prints its URLs; return it, the URLs, its children."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "targets.fleet", "--profile", PROFILE, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    n = 1 + int(args[args.index("--replicas") + 1])
    urls = [proc.stdout.readline().strip() for _ in range(n)]
    assert all(u.startswith("http://127.0.0.1:") for u in urls), (
        urls,
        proc.stderr.read() if proc.poll() else "",
    )
    assert proc.stderr.readline().startswith("fleet ready: ")
    return proc, urls, children_of(proc.pid)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_serve_fleet_tears_down_on_signal(sig, tmp_path):
    proc, urls, children = serve(
        "--replicas", "2", "--router", "sglang:round_robin", "--log-dir", str(tmp_path)
    )
    try:
        assert len(children) == 3
        assert http_get(f"{urls[0]}/workers")[0] == 200
        proc.send_signal(sig)
        assert proc.wait(timeout=15) == 0
        assert all_gone(children) == []
    finally:
        proc.kill()
        proc.wait()


def test_serve_fleet_children_die_with_a_killed_parent(tmp_path):
    proc, _urls, children = serve(
        "--replicas", "2", "--router", "vllm:round_robin", "--log-dir", str(tmp_path)
    )
    assert len(children) == 3
    proc.kill()  # SIGKILL: no handler runs; the kernel's parent-death signal must do it
    proc.wait()
    assert all_gone(children) == []


def test_serve_fleet_prints_the_router_url_first(tmp_path):
    proc, urls, children = serve(
        "--replicas", "2", "--router", "sglang:cache_aware", "--log-dir", str(tmp_path)
    )
    try:
        status, body = http_get(f"{urls[0]}/workers")
        assert status == 200
        assert sorted(w["url"] for w in json.loads(body)["workers"]) == sorted(urls[1:])
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=15)
    assert all_gone(children) == []


@pytest.mark.parametrize(
    ("args", "last_line"),
    [
        (["--router", "sglang:nope"],
         "Error: Invalid value for '--router': unknown policy 'nope' for sglang-router; choose one of: "
         "cache_aware, manual, power_of_two, random, round_robin"),
        (["--replicas", "3", "--router", "none"],
         "Error: --replicas 3 needs a router to share one URL; use e.g. --router sglang:round_robin"),
    ],
)  # fmt: skip
def test_serve_fleet_bad_input_exits_2_with_one_line(args, last_line):
    done = subprocess.run(
        [sys.executable, "-m", "targets.fleet", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines()[-1] == last_line


def test_serve_fleet_refuses_a_port_in_use(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "targets.fleet", "--router-port", str(port), "--log-dir", str(tmp_path)],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr == (
        f"Error: sglang-router port {port} on 127.0.0.1 is already in use by pid {os.getpid()} "
        f"({process_title(os.getpid())}); stop it or choose another port\n"
    )


@pytest.mark.llamacpp
def test_llama_server_replicas_behind_a_router(llama_paths, tmp_path):
    with start_fleet(
        replicas=2,
        engine="llama-server",
        seed=3,
        router="sglang:round_robin",
        log_dir=tmp_path,
        startup_timeout_s=120,
    ) as fleet:
        pids = [p.pid for p in fleet.processes()]
        before = [_llama_prompt_tokens(u) for u in fleet.replica_urls]
        body = json.dumps({"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}).encode()
        for _ in range(4):
            req = urllib.request.Request(
                f"{fleet.url}/v1/chat/completions", body, {"Content-Type": "application/json"}
            )
            with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=120) as resp:
                assert resp.status == 200
        after = [_llama_prompt_tokens(u) for u in fleet.replica_urls]
        # Round robin: both replicas did prompt work (llama-server counts tokens, not requests).
        assert all(a > b for a, b in zip(after, before, strict=True))
    assert all_gone(pids) == []


def _llama_prompt_tokens(url: str) -> float:
    _, body = http_get(f"{url}/metrics")
    line = next(ln for ln in body.decode().splitlines() if ln.startswith("llamacpp:prompt_tokens_total"))
    return float(line.split()[-1])
