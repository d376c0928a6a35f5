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
    # Two sessions at once, so two connections end up waiting.
    a, b = pool.take(), pool.take()
    for conn in (a, b):
        assert run(servers.raw, "raw-idle-close", chat(2, tokens=2, delay_ms=1), conn=conn).ok
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
