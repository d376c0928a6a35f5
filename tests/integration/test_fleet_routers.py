"""Real routers in front of simulated replicas on 127.0.0.1: splits, affinity, streaming, identity."""

from __future__ import annotations

import dataclasses
import http.client
import json
import os
import re
import time
import uuid

import pytest

from targets.fleet.fleet import start_sim_replicas
from targets.fleet.procs import FleetError, stop_all
from targets.fleet.routers import check_identity, start_router

ROUTERS = ["sglang", "vllm"]


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    """Two tiny sims, shared by the tests here; each test starts its own router."""
    started = start_sim_replicas(
        2,
        profile="tiny",
        time_scale=1.0,
        seed=11,
        log_dir=tmp_path_factory.mktemp("sims"),
        startup_timeout_s=30,
    )
    yield started
    stop_all([r.process for r in started])


@pytest.fixture
def routers(tmp_path):
    """Start routers through this and they are stopped after the test."""
    started = []

    def start(spec, urls, **kw):
        router = start_router(spec, urls, log_dir=tmp_path, startup_timeout_s=30, **kw)
        started.append(router)
        return router

    yield start
    stop_all([r.process for r in started])


def _conn(url: str, timeout_s: float = 10.0) -> http.client.HTTPConnection:
    host, port = url.removeprefix("http://").split(":")
    return http.client.HTTPConnection(host, int(port), timeout=timeout_s)


def get(url: str, path: str) -> tuple[int, bytes]:
    c = _conn(url)
    try:
        c.request("GET", path)
        resp = c.getresponse()
        return resp.status, resp.read()
    finally:
        c.close()


def chat(url: str, messages: list[dict], headers: dict[str, str] | None = None, max_tokens: int = 4) -> str:
    """One non-streaming chat request; returns the reply text."""
    c = _conn(url)
    try:
        body = {"model": "sim-tiny", "messages": messages, "max_tokens": max_tokens}
        c.request(
            "POST",
            "/v1/chat/completions",
            json.dumps(body),
            {"Content-Type": "application/json", **(headers or {})},
        )
        resp = c.getresponse()
        data = resp.read()
        assert resp.status == 200, data
        return json.loads(data)["choices"][0]["message"]["content"]
    finally:
        c.close()


def requests_total(replica_url: str) -> int:
    _, body = get(replica_url, "/metrics")
    m = re.search(r"^sim:requests_total(?:\{[^}]*\})? (\S+)$", body.decode(), re.MULTILINE)
    assert m, body
    return int(float(m.group(1)))


def served_by(replicas, request_id: str) -> str:
    """The server id of the replica whose ground truth has this request."""
    hits = [r.server_id for r in replicas if get(r.url, f"/sim/requests/{request_id}")[0] == 200]
    assert len(hits) == 1, (request_id, hits)
    return hits[0]


def ask(router_url: str, replicas, messages, headers=None) -> tuple[str, str]:
    """Send one turn with a fresh X-Request-ID; return (reply, server id that served it)."""
    rid = uuid.uuid4().hex
    reply = chat(router_url, messages, {"X-Request-ID": rid, **(headers or {})})
    return reply, served_by(replicas, rid)


@pytest.mark.parametrize("kind", ROUTERS)
def test_round_robin_splits_requests_evenly(kind, replicas, routers):
    urls = [r.url for r in replicas]
    router = routers(f"{kind}:round_robin", urls)
    ident = router.identity
    assert (ident.name, ident.policy, ident.worker_urls) == (f"{kind}-router", "round_robin", tuple(urls))
    assert ident.version and ident.pid == router.process.pid
    assert ident.url.startswith("http://127.0.0.1:") and ident.prometheus_url.startswith("http://127.0.0.1:")
    before = [requests_total(u) for u in urls]
    for i in range(8):
        chat(router.url, [{"role": "user", "content": f"question {i}"}])
    assert [requests_total(u) - b for u, b in zip(urls, before, strict=True)] == [4, 4]
    router.verify()  # now with a policy in its metrics, still the router we started


@pytest.mark.parametrize("spec", ["sglang:manual", "vllm:consistent_hash", "vllm:sticky_least_loaded"])
def test_session_header_keeps_each_session_on_one_replica(spec, replicas, routers):
    router = routers(spec, [r.url for r in replicas])
    assert router.identity.affinity == "header"
    conversations = {f"session-{i}": [] for i in range(16)}
    where: dict[str, set[str]] = {s: set() for s in conversations}
    for turn in range(3):  # interleaved, like concurrent sessions arriving turn by turn
        for session, messages in conversations.items():
            messages.append({"role": "user", "content": f"{session} turn {turn}"})
            reply, server = ask(router.url, replicas, messages, {router.session_header: session})
            messages.append({"role": "assistant", "content": reply})
            where[session].add(server)
    assert all(len(servers) == 1 for servers in where.values()), where
    assert len(set().union(*where.values())) == 2, "16 sessions should not all hash to one replica"


def test_without_the_session_header_consistent_hash_spreads_a_session(replicas, routers):
    # vllm-router hashes X-Request-ID when there is no X-Session-ID: each turn lands anywhere.
    router = routers("vllm:consistent_hash", [r.url for r in replicas])
    servers = {ask(router.url, replicas, [{"role": "user", "content": "same session"}])[1] for _ in range(16)}
    assert servers == {"replica-0", "replica-1"}


def test_vllm_cache_aware_has_no_prefix_affinity_over_http(replicas, routers):
    # vllm-router's cache_aware has no tokens for HTTP workers and routes to the least-loaded
    # replica. Which one that is depends on when the router drops the previous stream from its
    # load count, so no placement is asserted (tests/integration/test_fleet_run_routers.py shows
    # it spreading a session's turns under concurrent load).
    router = routers("vllm:cache_aware", [r.url for r in replicas])
    assert router.identity.affinity == "none"
    messages = [{"role": "user", "content": "one request"}]
    reply, server = ask(router.url, replicas, messages)
    assert reply and server in {"replica-0", "replica-1"}


def test_cache_aware_keeps_a_growing_conversation_on_one_replica(replicas, routers):
    router = routers("sglang:cache_aware", [r.url for r in replicas])
    assert router.identity.affinity == "prefix"
    where = {}
    for s in range(3):
        messages = [{"role": "system", "content": f"Agent {s}: " + f"tool spec {s} " * 40}]
        served = set()
        for turn in range(4):
            messages.append({"role": "user", "content": f"step {turn} of task {s}"})
            reply, server = ask(router.url, replicas, messages)  # no header: the prefix decides
            messages.append({"role": "assistant", "content": reply})
            served.add(server)
        where[s] = served
    # Each conversation stays where its prefix is cached. Where a new prefix (no cached match) goes
    # is the router's choice (the replica with the smaller tree, or the less loaded one, depending
    # on when it counts the last stream done), so it is not asserted.
    assert all(len(servers) == 1 for servers in where.values()), where


@pytest.mark.parametrize("kind", ROUTERS)
def test_streaming_passes_through_unbuffered(kind, replicas, routers):
    router = routers(f"{kind}:round_robin", [r.url for r in replicas])
    rid = uuid.uuid4().hex
    body = {"model": "sim-tiny", "messages": [{"role": "user", "content": "stream please"}], "max_tokens": 600,
            "stream": True}  # fmt: skip
    c = _conn(router.url)
    first_token_ns = None
    try:
        c.request(
            "POST",
            "/v1/chat/completions",
            json.dumps(body),
            {"Content-Type": "application/json", "X-Request-ID": rid},
        )
        resp = c.getresponse()
        assert resp.status == 200
        while line := resp.readline():
            if (
                first_token_ns is None
                and line.startswith(b"data: {")
                and b'"content":"' in line.replace(b" ", b"")
            ):
                chunk = json.loads(line[6:])
                if chunk["choices"][0]["delta"].get("content"):
                    first_token_ns = time.perf_counter_ns()
    finally:
        c.close()
    assert first_token_ns is not None
    server = served_by(replicas, rid)
    replica = next(r for r in replicas if r.server_id == server)
    truth = json.loads(get(replica.url, f"/sim/requests/{rid}")[1])
    generating_ns = truth["t_end_ns"] - truth["t_first_token_ns"]
    assert truth["completion_tokens"] == 600 and generating_ns > 400_000_000  # ~0.9 s of decode
    # The client saw the first token while the replica was still early in its generation,
    # i.e. the router forwarded the chunk rather than the finished body.
    assert first_token_ns - truth["t_first_token_ns"] < 250_000_000
    assert first_token_ns < truth["t_first_token_ns"] + generating_ns // 2


def test_routers_bind_loopback_only_and_two_can_run_at_once(replicas, routers):
    urls = [r.url for r in replicas]
    started = [
        routers("sglang:round_robin", urls),
        routers("sglang:cache_aware", urls),
        routers("vllm:random", urls),
    ]
    for router in started:
        assert router.process.alive()
        assert get(router.identity.prometheus_url, "/metrics")[0] == 200
        listening = _listening_addresses(router.process.pid)
        assert listening and all(addr == "127.0.0.1" for addr, _port in listening), listening


def _listening_addresses(pid: int) -> list[tuple[str, int]]:
    inodes = set()
    for fd in os.scandir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(fd.path)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:
                    hex_addr, hex_port = cols[1].split(":")
                    v4 = len(hex_addr) == 8  # little-endian IPv4; anything else is IPv6, never loopback v4
                    addr = (
                        ".".join(str(int(hex_addr[i : i + 2], 16)) for i in (6, 4, 2, 0)) if v4 else hex_addr
                    )
                    found.append((addr, int(hex_port, 16)))
    return found


def test_a_stale_router_on_the_port_is_refused(replicas, routers):
    urls = [r.url for r in replicas]
    stale = routers("sglang:round_robin", urls)
    port = int(stale.url.rsplit(":", 1)[1])
    with pytest.raises(FleetError) as e:
        routers("sglang:cache_aware", urls, port=port)
    assert str(e.value) == (
        f"sglang-router port {port} on 127.0.0.1 is already in use by pid {stale.process.pid} (sglang::router); "
        "stop it or choose another port"
    )

    # The same check before load: the process on the port must be ours, with our workers and policy.
    ours = dataclasses.replace(stale.identity, pid=stale.process.pid + 100000, policy="cache_aware")
    with pytest.raises(FleetError, match=rf"^router at {stale.url} is served by pid {stale.process.pid} \(sglang::router\), not by the sglang-router we started \(pid {ours.pid}\); stop the process on port {port} or choose another port$"):  # fmt: skip
        check_identity(ours, stale.spec.kind)
    other_workers = dataclasses.replace(stale.identity, worker_urls=(urls[0],))
    with pytest.raises(
        FleetError, match=r"routes to \['http://127.0.0.1:\d+', 'http://127.0.0.1:\d+'\], expected \["
    ):
        check_identity(other_workers, stale.spec.kind)
    chat(stale.url, [{"role": "user", "content": "hello"}])  # its metrics now name its policy
    other_policy = dataclasses.replace(stale.identity, policy="cache_aware")
    with pytest.raises(FleetError, match=r"routes with policy 'round_robin', expected 'cache_aware'"):
        check_identity(other_policy, stale.spec.kind)


@pytest.mark.parametrize("kind", ROUTERS)
def test_a_router_that_fails_to_start_shows_its_log_tail(kind, replicas, tmp_path):
    t0 = time.monotonic()
    with pytest.raises(FleetError) as e:
        start_router(f"{kind}:round_robin", [r.url for r in replicas], log_dir=tmp_path,
                     extra_args=["--balance-abs-threshold", "lots"])  # fmt: skip
    assert time.monotonic() - t0 < 20
    message = str(e.value)
    assert "\n" not in message
    assert re.match(rf"^{kind}-router-\d+ \(pid \d+\) exited with code 2; log tail \(", message), message
    assert "invalid int value: 'lots'" in message
