"""The worker's single stream reader: many sockets, one greenlet, each stream's end or failure
reaching its own greenlet only (loadgen/engine/stream_reader.py). Real loopback sockets, gevent."""

from __future__ import annotations

import gevent
import pytest
from gevent import socket as gsocket

from loadgen.engine import stream_reader as sr

pytestmark = pytest.mark.skipif(not sr.AVAILABLE, reason="no epoll on this system")


def _pair() -> tuple[gsocket.socket, gsocket.socket]:
    a, b = gsocket.socketpair()
    return a, b


def test_streams_are_read_concurrently_and_each_ends_in_its_own_greenlet() -> None:
    reader = sr.stream_reader()
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


def test_a_timeout_while_following_lets_go_of_the_socket() -> None:
    reader = sr.stream_reader()
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
