"""The worker's single stream reader: many sockets, one greenlet, each stream's end or failure
reaching its own greenlet only (loadgen/engine/stream_reader.py). Real loopback sockets, gevent.
Every test runs on both loops: the compiled one (``_reader.Poller``) and the Python reference."""

from __future__ import annotations

import gevent
import pytest
from gevent import socket as gsocket

from loadgen.engine import stream_reader as sr

pytestmark = pytest.mark.skipif(not sr.AVAILABLE, reason="no epoll on this system")


@pytest.fixture(params=["compiled", "python"])
def reader(request: pytest.FixtureRequest) -> sr.StreamReader:
    if request.param == "compiled" and sr._Poller is None:
        pytest.skip("the compiled reader is not built")
    return sr.StreamReader(compiled=request.param == "compiled")


def _pair() -> tuple[gsocket.socket, gsocket.socket]:
    a, b = gsocket.socketpair()
    return a, b


def test_streams_are_read_concurrently_and_each_ends_in_its_own_greenlet(reader: sr.StreamReader) -> None:
    pairs = [_pair() for _ in range(3)]
    got: dict[int, list[bytes]] = {i: [] for i in range(3)}

    def follow(i: int) -> str:
        def consume(data: bytes, _anc: list) -> bool:
            if data == b"boom":
                raise ValueError(f"stream {i} sent boom")
            got[i].append(data)
            return data.endswith(b"END")

        try:
            reader.follow(pairs[i][0], 4096, consume)
        except ValueError as e:
            return str(e)
        return "ended"

    greenlets = [gevent.spawn(follow, i) for i in range(3)]
    gevent.sleep(0.01)
    for rnd in range(5):  # interleaved writes, each read as it comes
        for i, (_, w) in enumerate(pairs):
            w.sendall(b"%d:%d;" % (i, rnd))
            gevent.sleep(0.002)
    pairs[0][1].sendall(b"END")
    pairs[1][1].sendall(b"boom")
    pairs[2][1].close()  # b"" reaches consume once; nothing can follow it, so following ends
    gevent.joinall(greenlets, timeout=2)
    assert [g.value for g in greenlets] == ["ended", "stream 1 sent boom", "ended"]
    assert b"".join(got[0]) == b"0:0;0:1;0:2;0:3;0:4;END"
    assert b"".join(got[1]) == b"1:0;1:1;1:2;1:3;1:4;"
    assert got[2][-1] == b"" and b"".join(got[2]) == b"2:0;2:1;2:2;2:3;2:4;"
    assert not reader._followed
    for a, b in pairs:
        a.close()
        b.close()


def test_a_timeout_while_following_lets_go_of_the_socket(reader: sr.StreamReader) -> None:
    a, b = _pair()
    with pytest.raises(gevent.Timeout), gevent.Timeout(0.05):
        reader.follow(a, 4096, lambda data, anc: True)
    assert a.fileno() not in reader._followed
    # The same socket can be followed again, and data that came in between is read.
    b.sendall(b"late")
    seen = []
    reader.follow(a, 4096, lambda data, anc: seen.append(data) or True)
    assert seen == [b"late"]
    a.close()
    b.close()


def _tcp_pair() -> tuple[gsocket.socket, gsocket.socket]:
    lsn = gsocket.socket()
    lsn.bind(("127.0.0.1", 0))
    lsn.listen(1)
    c = gsocket.create_connection(lsn.getsockname())
    s, _ = lsn.accept()
    lsn.close()
    return c, s


def test_a_reset_connection_fails_its_own_stream_with_the_os_error(reader: sr.StreamReader) -> None:
    import socket
    import struct

    a, b = _tcp_pair()
    b.sendall(b"first")
    got: list[bytes] = []
    g = gevent.spawn(reader.follow, a, 4096, lambda data, t: got.append(data) or False)
    gevent.sleep(0.02)
    b.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    b.close()  # RST: the next read fails with ECONNRESET
    g.join(timeout=2)
    assert isinstance(g.exception, ConnectionResetError)
    assert got == [b"first"]
    assert not reader._followed
    a.close()


def test_each_read_carries_its_kernel_receive_stamp(reader: sr.StreamReader) -> None:
    import time

    a, b = _tcp_pair()
    stamps: list[int] = []
    before = time.perf_counter_ns()
    g = gevent.spawn(reader.follow, a, 4096, lambda data, t: stamps.append(t) or data == b"x")
    gevent.sleep(0.01)
    b.sendall(b"x")
    g.join(timeout=2)
    after = time.perf_counter_ns()
    assert g.successful() and len(stamps) == 1
    assert before <= stamps[0] <= after
    a.close()
    b.close()


@pytest.mark.skipif(sr._Poller is None, reason="the compiled reader is not built")
def test_poller_reads_every_ready_socket_and_keeps_to_its_budget() -> None:
    poller = sr._Poller()
    pairs = [gsocket.socketpair() for _ in range(4)]
    seen: list[tuple[int, bytes]] = []
    for i, (a, b) in enumerate(pairs):
        poller.add(a.fileno(), 64, lambda data, t, i=i: seen.append((i, data)) or data == b"end")
        b.sendall(b"end" if i == 2 else b"more")
    reads, ended = poller.poll(0)  # a spent budget still reads one socket, then stops
    assert reads == 1 and len(seen) == 1
    reads, ended = poller.poll(10**9)
    assert reads == 3 and sorted(seen) == [(0, b"more"), (1, b"more"), (2, b"end"), (3, b"more")]
    assert ended == [(pairs[2][0].fileno(), None)] and poller.count == 3
    assert poller.poll(10**9) == (0, [])  # nothing left to read: nothing called


@pytest.mark.skipif(sr._Poller is None, reason="the compiled reader is not built")
def test_poller_gives_a_reused_descriptor_to_its_new_stream_only() -> None:
    poller = sr._Poller()
    a, b = gsocket.socketpair()
    old: list[bytes] = []
    new: list[bytes] = []
    poller.add(a.fileno(), 64, lambda data, t: old.append(data) or False)
    b.sendall(b"one")
    poller.remove(a.fileno())
    poller.add(a.fileno(), 64, lambda data, t: new.append(data) or False)
    assert poller.poll(10**9) == (1, []) and old == [] and new == [b"one"]
    poller.remove(a.fileno())
    poller.remove(a.fileno())  # twice: no error
    assert poller.count == 0
    with pytest.raises(ValueError):
        poller.add(a.fileno(), 0, print)


@pytest.mark.skipif(sr._Poller is None, reason="the compiled reader is not built")
def test_poller_lets_a_base_exception_through_and_lets_go_of_its_socket() -> None:
    poller = sr._Poller()
    a, b = gsocket.socketpair()

    def consume(data: bytes, t: int) -> bool:
        raise KeyboardInterrupt

    poller.add(a.fileno(), 64, consume)
    b.sendall(b"x")
    with pytest.raises(KeyboardInterrupt):
        poller.poll(10**9)
    assert poller.count == 0


@pytest.mark.skipif(sr._Poller is None, reason="the compiled reader is not built")
def test_poller_still_reports_a_stream_that_ended_before_a_base_exception() -> None:
    poller = sr._Poller()
    (a, b), (c, d) = gsocket.socketpair(), gsocket.socketpair()

    def interrupt(data: bytes, t: int) -> bool:
        raise KeyboardInterrupt

    poller.add(a.fileno(), 64, lambda data, t: True)  # ends at its first read
    poller.add(c.fileno(), 64, interrupt)
    b.sendall(b"x")
    d.sendall(b"y")
    ended: list = []
    for _ in range(2):  # whichever the kernel lists first, the end reaches the caller
        try:
            ended += poller.poll(10**9)[1]
        except KeyboardInterrupt:
            pass
    assert ended == [(a.fileno(), None)] and poller.count == 0
