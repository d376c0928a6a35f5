"""A worker's connections handed from session to session (``--connections``), against real
servers on 127.0.0.1 (``test_client_stream``'s, which log each request's client address)."""

from __future__ import annotations

import time

import pytest

from tests.integration.test_client_stream import chat, run, start_servers, stop_servers


@pytest.fixture(scope="module")
def servers():
    s = start_servers()
    yield s
    stop_servers(s)


def _pool(base: str, mode: str = "pooled"):
    from loadgen.engine.client import SessionConnection
    from loadgen.engine.connection_pool import ConnectionPool

    made = []

    def make():
        made.append(SessionConnection(base))
        return made[-1]

    return ConnectionPool(make, mode), made


def _session(pool, servers, base: str, scenario: str, turns: int = 1):
    """One session as ``run_session`` holds its connection: taken at its start, given at its end."""
    conn = pool.take()
    try:
        reqs = [chat(3, tokens=3, delay_ms=1) for _ in range(turns)]
        results = [run(base, scenario, r, conn=conn) for r in reqs]
    finally:
        pool.give(conn)
    assert all(r.ok for r in results), [r.error_message for r in results]
    return [servers.log(r.request_id)["peer"] for r in reqs], results


def _two_at_once(pool, servers):
    """Two sessions at once on raw-idle-close (which closes a connection idle for 50 ms), so two
    connections end up waiting; they are returned to the caller, not yet given back."""
    a, b = pool.take(), pool.take()
    for conn in (a, b):
        assert run(servers.raw, "raw-idle-close", chat(2, tokens=2, delay_ms=1), conn=conn).ok
    return a, b


def test_pooled_sessions_share_one_kept_connection(servers):
    pool, made = _pool(f"{servers.http}/ok")
    peers = []
    for _ in range(4):
        p, results = _session(pool, servers, servers.http, "ok")
        peers += p
    assert len(made) == 1 and made[0].connections_opened == 1
    assert len(set(peers)) == 1, peers  # the server saw one connection carry all four sessions
    assert pool.handed_on == 3 and pool.waiting == 1
    assert pool.counts() == {"opened": 1, "handed_on": 3}
    assert results[0].reused_connection
    pool.close()
    assert pool.waiting == 0 and not made[0].is_idle_open()


def test_per_session_connects_and_closes_each_session(servers):
    pool, made = _pool(f"{servers.http}/ok", "per-session")
    peers = [_session(pool, servers, servers.http, "ok")[0][0] for _ in range(3)]
    assert len(made) == 3 and len(set(peers)) == 3
    assert pool.waiting == 0 and pool.counts() == {"opened": 3, "handed_on": 0}
    assert not any(c.is_idle_open() for c in made)


def test_a_connection_the_server_will_not_keep_is_not_handed_on(servers):
    # Connection: close on the reply: the connection is closed at the reply's end, never pooled.
    pool, made = _pool(f"{servers.http}/close")
    for _ in range(2):
        _session(pool, servers, servers.http, "close")
    assert pool.waiting == 0 and len(made) == 2


def test_a_kept_connection_the_server_closed_while_it_waited_is_replaced(servers):
    # raw-idle-close: the server closes an idle connection after 50 ms. The next session's
    # connection is found closed at its first request and replaced; the session never sees it.
    pool, made = _pool(f"{servers.raw}/raw-idle-close")
    _session(pool, servers, servers.raw, "raw-idle-close")
    time.sleep(0.3)
    _, results = _session(pool, servers, servers.raw, "raw-idle-close")
    assert len(made) == 1 and made[0].connections_opened == 2 == pool.counts()["opened"]  # the replacement counts
    assert results[0].reused_connection is False


def test_the_longest_waiting_connection_is_closed_when_its_server_closed_it(servers):
    from loadgen.engine.client import SessionConnection

    pool, _ = _pool(f"{servers.raw}/raw-idle-close")
    a, b = _two_at_once(pool, servers)
    pool.give(a)
    time.sleep(0.3)  # the server closes both idle connections
    assert a.server_closed()
    pool.give(b)  # looks at the oldest (a): closed by the server, so it is dropped
    assert pool.waiting == 1 and not a.is_idle_open()
    assert pool.take() is b
    fresh = SessionConnection(f"{servers.raw}/raw-idle-close")
    assert fresh.server_closed()  # nothing open: nothing to carry a request


def test_a_connection_killed_mid_request_is_not_handed_on(servers):
    import gevent

    pool, _ = _pool(f"{servers.http}/ok")
    conn = pool.take()
    g = gevent.spawn(run, servers.http, "ok", chat(50, tokens=50, delay_ms=40), conn=conn)
    gevent.sleep(0.3)
    g.kill(block=True)
    pool.give(conn)
    assert pool.waiting == 0 and not conn.is_idle_open()


def test_an_unknown_mode_is_refused():
    from loadgen.engine.connection_pool import ConnectionPool

    with pytest.raises(ValueError, match="pooled, per-session"):
        ConnectionPool(lambda: None, "shared")


def test_a_kept_connection_on_a_descriptor_past_1023_is_still_reused(servers):
    # select() cannot take a descriptor past 1,023: a worker holding a thousand connections has
    # them, and each of its kept connections read as closed and was opened again.
    import os
    import resource

    from loadgen.engine.client import SessionConnection

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 1300
    if soft < want:
        if hard != resource.RLIM_INFINITY and hard < want:
            pytest.skip(f"the descriptor limit ({hard}) is under {want}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    filler = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        with SessionConnection(f"{servers.http}/ok") as conn:
            results = [run(servers.http, "ok", chat(2, tokens=2, delay_ms=1), conn=conn) for _ in range(3)]
            assert conn._sock.fileno() > 1023
            assert all(r.ok for r in results), [r.error_message for r in results]
            assert conn.connections_opened == 1
            assert [r.reused_connection for r in results] == [False, True, True]
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_session_about_to_start_takes_only_a_connection_still_open(servers):
    # The driver takes a kept connection for a session it spawns at its time (take_open): one
    # the server closed while it waited is closed there, not handed to the session.
    pool, _ = _pool(f"{servers.raw}/raw-idle-close")
    a, b = _two_at_once(pool, servers)
    pool.give(a)
    pool.give(b)
    time.sleep(0.3)  # the server closes both idle connections
    assert pool.waiting >= 1 and b.is_idle_open()  # closed by the server, not yet seen so here
    assert pool.take_open() is None
    assert pool.waiting == 0 and not a.is_idle_open() and not b.is_idle_open()
    assert pool.counts() == {"opened": 2, "handed_on": 0}


def test_a_connection_taken_for_a_session_that_did_not_start_goes_back_uncounted(servers):
    pool, made = _pool(f"{servers.http}/ok")
    _session(pool, servers, servers.http, "ok")
    conn = pool.take_open()
    assert conn is made[0] and pool.waiting == 0 and pool.handed_on == 1
    pool.untake(conn)  # the run stopped before the session's time: nobody was handed it
    assert pool.waiting == 1 and pool.counts() == {"opened": 1, "handed_on": 0}
    assert pool.take() is conn


def test_a_driver_stopped_while_it_holds_a_kept_connection_for_a_session_gives_it_back(servers):
    # Open loop with a 2 s lead and sessions 0.5 s apart: the driver takes the first connection a
    # session leaves for the session due ~2 s later, and holds it until that session's time. A
    # stop in between must put it back uncounted: every session started either opened its
    # connection or was handed a kept one, never both, never neither.
    import gevent

    from loadgen.config import Plan, RunConfig
    from loadgen.engine.driver import Driver
    from workloads.loader import load_workload

    cfg = RunConfig(
        run_id="held", workload="tiny", arrival="constant", rate_per_s=2.0, num_sessions=40,
        target_url=f"{servers.http}/ok",
    )  # fmt: skip
    records = []
    driver = Driver(Plan(cfg, 1, 0, time.time() + 0.2), worker_id="w", workload=load_workload("tiny"),
                    on_record=records.append, api_key=None)  # fmt: skip
    driver.session_lead_ns = 2_000_000_000
    pool = driver.ctx.connections
    driver.start()
    held = False
    for _ in range(150):  # 3 s at most
        gevent.sleep(0.02)
        # A kept connection taken before the 8th session (due 3.5 s in) started: the driver
        # took it for a session not yet due (the sessions it spawned took new ones).
        if pool.handed_on > 0 and driver.sessions_started < 8:
            held = True
            break
    driver.drain(5.0)
    counts = pool.counts()
    assert held, (counts, driver.sessions_started)
    assert counts["opened"] + counts["handed_on"] == driver.sessions_started, (counts, driver.sessions_started)
    assert pool.waiting == 0
    assert all(r.status == "ok" for r in records), [r.error_message for r in records if r.status != "ok"]
