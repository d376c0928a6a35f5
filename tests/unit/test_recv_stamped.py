"""The compiled read with its stamp (``_reader.recv_stamped``) against the Python one it replaces
(``recvmsg`` + ``http_reply.arrival_ns``), on real loopback TCP sockets: the same bytes, a stamp
on the same clock taken the same way (the kernel's when asked for, bounded by the send and the
read), the same errors.
"""

from __future__ import annotations

import socket
import struct
import time

import pytest

from loadgen.engine import http_reply
from loadgen.engine.http_reply import _SO_TIMESTAMPNS, arrival_ns

_reader = http_reply._reader
pytestmark = pytest.mark.skipif(_reader is None, reason="the compiled reader is not built (make setup builds it)")


@pytest.fixture
def pair():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    a = socket.create_connection(srv.getsockname())
    b, _ = srv.accept()
    srv.close()
    b.setblocking(False)
    yield a, b
    a.close()
    b.close()


def _python_read(sock: socket.socket, n: int) -> tuple[bytes, int]:
    data, anc, _flags, _addr = sock.recvmsg(n, socket.CMSG_SPACE(16))
    return data, arrival_ns(anc)


def _wait_readable(sock: socket.socket) -> None:
    import select

    select.select([sock], [], [], 5)


@pytest.mark.parametrize("stamped", [True, False])
def test_the_same_bytes_and_a_stamp_taken_the_same_way(pair, stamped) -> None:
    a, b = pair
    if stamped:
        b.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
    for reader in ("c", "python", "c", "python"):
        t_sent = time.perf_counter_ns()
        a.sendall(b"data: x\n" * 3)
        _wait_readable(b)
        time.sleep(0.02)  # the data waits: a kernel stamp says when it came, a read only when read
        t_before_read = time.perf_counter_ns()
        data, t = _reader.recv_stamped(b.fileno(), 4096) if reader == "c" else _python_read(b, 4096)
        t_after = time.perf_counter_ns()
        assert data == b"data: x\n" * 3
        if stamped:
            assert t_sent <= t <= t_sent + 15_000_000, (reader, (t - t_sent) / 1e6)  # before the wait ended
        else:
            assert t_before_read <= t <= t_after, reader


def test_a_short_read_nothing_there_and_the_peers_close(pair) -> None:
    a, b = pair
    a.sendall(b"abcdef")
    _wait_readable(b)
    assert _reader.recv_stamped(b.fileno(), 4)[0] == b"abcd"
    assert _reader.recv_stamped(b.fileno(), 4)[0] == b"ef"
    with pytest.raises(BlockingIOError):
        _reader.recv_stamped(b.fileno(), 4)
    a.close()
    _wait_readable(b)
    data, t = _reader.recv_stamped(b.fileno(), 4)
    assert data == b"" and abs(t - time.perf_counter_ns()) < 1_000_000_000


def test_errors_are_the_oserrors_recvmsg_raises(pair) -> None:
    a, b = pair
    a.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    a.close()  # an RST
    _wait_readable(b)
    with pytest.raises(ConnectionResetError):
        _reader.recv_stamped(b.fileno(), 16)
    fd = b.fileno()
    b.close()
    with pytest.raises(OSError):
        _reader.recv_stamped(fd, 16)
    with pytest.raises(ValueError):
        _reader.recv_stamped(0, 0)
