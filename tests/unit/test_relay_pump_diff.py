"""The capture relay's compiled body pump (loadgen/capture/_relay.c) against the Python relay it
stands for (``UpstreamConnection``'s decoder with a sink, as ``proxy._ClientSink`` uses it).

One reply (chunked, Content-Length or to the close; well formed, or cut, or corrupted anywhere)
arrives in reads cut at random places. The reference takes every read through
``data_received``. The pumped side takes the first ``k`` reads the same way, before the hand-over
(so the hand-over happens in any decoder state: a cut size line, inside a chunk, at its CRLF, in
the trailer), then ``hand_over()`` gives the socket and state to ``_relay.Pump``, which reads the
rest from a real socket, one read per cut. Both must give the same pieces per read (the early
ones joined), the same bytes to the client (raw, or chunk-framed with one chunk per piece), the
same recorded pieces, and the same end: whole and reusable, whole and not, or the same error.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import time

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loadgen.capture import pump as pump_module
from loadgen.capture.assembly import CHAT
from loadgen.capture.feed import CHUNK, END, REPLIED, SHED, ExchangeFeed
from loadgen.capture.pump import PumpEnd
from loadgen.capture.upstream_connection import BODY_DONE_NO_REUSE, BodyState, UpstreamConnection

from .test_capture_feed import read_events_to_end

_relay = pump_module._relay
pytestmark = pytest.mark.skipif(_relay is None, reason="the relay pump is not built (make setup builds it)")

XID = 7


class _Transport:
    """What UpstreamConnection needs of a transport; ``sock`` is the socket the pump reads."""

    def __init__(self, sock: socket.socket | None = None) -> None:
        self.sock = sock
        self.closed = False
        self.paused = False
        self.written = b""

    def get_extra_info(self, name: str, default: object = None) -> object:
        return self.sock if name == "socket" else default

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


async def _connection(head: bytes, transport: _Transport) -> tuple[UpstreamConnection, object]:
    conn = UpstreamConnection(lambda c: None, read_timeout_s=60.0)
    conn.connection_made(transport)  # type: ignore[arg-type]
    exchange = asyncio.ensure_future(conn.exchange("GET", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b""))
    await asyncio.sleep(0)
    conn.data_received(head)
    return conn, await exchange


def _end_of(conn: UpstreamConnection) -> tuple:
    if conn._error is not None:
        return ("broke", str(conn._error))
    if conn._phase == 3:  # _DONE
        return ("done", conn.reusable)
    return ("open",)


async def _reference(head: bytes, cuts: list[bytes], eof: bool) -> tuple[list[bytes], tuple]:
    conn, reply = await _connection(head, _Transport())
    pieces: list[bytes] = []
    per_read: list[bytes] = []
    reply.start(lambda piece, chunk: pieces.append(piece))
    for cut in cuts:
        if _end_of(conn)[0] != "open":
            break
        n = len(pieces)
        conn.data_received(cut)
        per_read.append(b"".join(pieces[n:]))
    if eof and _end_of(conn)[0] == "open":
        conn.connection_lost(None)
    return per_read, _end_of(conn)


def _dechunk(out: bytes) -> list[bytes]:
    pieces, pos = [], 0
    while pos < len(out):
        eol = out.index(b"\r\n", pos)
        size = int(out[pos:eol], 16)
        assert out[eol + 2 + size : eol + 4 + size] == b"\r\n", out
        pieces.append(out[eol + 2 : eol + 2 + size])
        pos = eol + 4 + size
    return pieces


def _drain(sock: socket.socket) -> bytes:
    got = b""
    while True:
        try:
            data = sock.recv(1 << 20)
        except BlockingIOError:
            return got
        if not data:
            return got
        got += data


async def _pumped(
    head: bytes, cuts: list[bytes], eof: bool, k: int, out_chunked: bool
) -> tuple[list[bytes], tuple] | None:
    up_ours, up_theirs = socket.socketpair()
    cl_ours, cl_theirs = socket.socketpair()
    for s in (up_ours, cl_ours, cl_theirs):
        s.setblocking(False)
    events: list[tuple] = []
    pump = _relay.Pump(events, CHUNK)
    try:
        transport = _Transport(up_ours)
        conn, reply = await _connection(head, transport)
        for cut in cuts[:k]:
            if _end_of(conn)[0] != "open":
                break
            conn.data_received(cut)
        if eof and k == len(cuts) and _end_of(conn)[0] == "open":
            conn.connection_lost(None)
        body = reply.hand_over()
        if body is None:  # it ended (or failed) before the hand-over: nothing to pump
            return None
        assert transport.paused
        framing = _relay.F_CHUNKED if body.chunked else _relay.F_CLOSE if body.to_close else _relay.F_LENGTH
        handle = pump.start(
            body.fd,
            cl_ours.fileno(),
            framing,
            body.left,
            body.chunk_state,
            body.carry,
            out_chunked,
            XID,
            body.early,
        )
        ended: list[tuple] = []

        def settle() -> bytes:
            """Run the pump and take what the client got until neither moves (a client's socket
            that filled up is emptied here, and the pump sends the rest)."""
            out = b""
            while True:
                news = pump.run()
                ended.extend(news)
                got = _drain(cl_theirs)
                out += got
                if not got and not news:
                    return out

        outputs = [settle()]  # the early body, sent at the start
        for cut in cuts[k:]:
            if ended:
                break
            up_theirs.sendall(cut)
            outputs.append(settle())
        if eof and not ended:
            up_theirs.shutdown(socket.SHUT_WR)
            outputs[-1] += settle()
        assert not pump.run(), "an end was reported twice"
        sent = [_dechunk(o) if out_chunked else [o] if o else [] for o in outputs]
        early = sent[0]
        assert (b"".join(early) == body.early) and len(early) <= 1 + len(body.early) // 65536
        per_read = [b"".join(p) for p in sent[1:]]
        recorded = [e[3] for e in events]
        assert all(e[0] == CHUNK and e[1] == XID for e in events)
        if out_chunked:  # one chunk per piece given, each one recorded
            assert recorded == [p for ps in sent for p in ps], "the feed got what the client got"
        else:
            assert b"".join(recorded) == b"".join(p for ps in sent for p in ps)
        if not ended:
            pump.stop(handle)
            assert pump.count == 0
            return [body.early, *per_read], ("open",)
        ((h, status, message),) = ended
        assert h == handle and pump.count == 0
        if status == _relay.ST_UPSTREAM:
            end: tuple = ("broke", message)
        elif status in (_relay.ST_DONE, _relay.ST_DONE_NO_REUSE):
            end = ("done", status == _relay.ST_DONE)
        else:
            raise AssertionError(f"unexpected status {status} {message}")
        return [body.early, *per_read], end
    finally:
        for s in (up_ours, up_theirs, cl_ours, cl_theirs):
            s.close()


def _same(head: bytes, cuts: list[bytes], eof: bool, k: int, out_chunked: bool) -> None:
    async def both() -> None:
        ref_reads, ref_end = await _reference(head, cuts, eof)
        got = await _pumped(head, cuts, eof, k, out_chunked)
        if got is None:  # the reference ended within the first k reads too
            assert ref_end[0] != "open" and len(ref_reads) <= k, (ref_reads, ref_end)
            return
        reads, end = got
        # The reference's first k reads are the pump's early body; the rest one read to one read.
        expected = [b"".join(ref_reads[:k]), *ref_reads[k:]]
        if ref_end == ("done", False) and eof and len(expected) > len(reads):
            expected = expected[: len(reads)]  # (the close-delimited end, read with the last cut)
        assert (reads, end) == (expected, ref_end), (cuts, k)

    asyncio.run(both())


def _size_line(draw, size: int) -> bytes:
    text = b"%x" % size if draw(st.integers(0, 3)) else b"%X" % size
    if not draw(st.integers(0, 5)):
        text = b"0" * draw(st.integers(1, 3)) + text
    if not draw(st.integers(0, 5)):
        text = b" " + text + b"\t"
    if not draw(st.integers(0, 4)):
        text += b";ext=" + draw(st.sampled_from([b"1", b'"q"', b"a b"]))
    return text + b"\r\n"


DATA = st.binary(min_size=1, max_size=40) | st.sampled_from([b"data: x\n\n", b"\r\n", b"0\r\n\r\n", b"\r"])


@st.composite
def _reply(draw) -> tuple[bytes, bytes, bool]:
    """(head, body bytes as sent, eof): any framing, then maybe broken."""
    kind = draw(st.sampled_from(["chunked", "length", "close"]))
    datas = draw(st.lists(DATA, min_size=0, max_size=6))
    if kind == "chunked":
        head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        body = b"".join(_size_line(draw, len(d)) + d + b"\r\n" for d in datas)
        body += _size_line(draw, 0)
        for _ in range(draw(st.integers(0, 2))):
            body += b"X-Trailer: " + draw(st.binary(max_size=8)).replace(b"\r\n", b"") + b"\r\n"
        body += b"\r\n"
    elif kind == "length":
        body = b"".join(datas) or b"x"
        declared = max(1, len(body) + draw(st.sampled_from([0, 0, 0, -1, -3, 1, 5])))
        head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % declared
    else:
        body = b"".join(datas)
        head = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n"
    if draw(st.integers(0, 5)) == 0 and body:  # a broken byte anywhere, often in a line's end
        ends = [i for i, c in enumerate(body) if c in b"\r\n"]
        at = draw(st.sampled_from(ends) if ends and draw(st.booleans()) else st.integers(0, len(body) - 1))
        body = body[:at] + draw(st.sampled_from([b"g", b"\n", b"\r", b";", b"-", b"\x00"])) + body[at + 1 :]
    if draw(st.integers(0, 5)) == 0 and body:  # cut short
        body = body[: draw(st.integers(0, len(body) - 1))]
    if draw(st.integers(0, 6)) == 0:  # bytes after the end
        body += b"HTTP/1.1 200 OK\r\n"
    eof = kind == "close" or draw(st.booleans())
    return head, body, eof


@st.composite
def _case(draw) -> tuple[bytes, list[bytes], bool, int, bool]:
    head, body, eof = draw(_reply())
    points = sorted(set(draw(st.lists(st.integers(0, len(body)), max_size=8))) | {0, len(body)})
    cuts = [body[a:b] for a, b in itertools.pairwise(points) if b > a]
    k = draw(st.integers(0, len(cuts)))
    return head, cuts, eof, k, draw(st.booleans())


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_case())
def test_the_pump_relays_and_ends_every_reply_as_the_python_relay_does(case) -> None:
    _same(*case)


@pytest.mark.parametrize(
    "body, says",
    [
        (b"5\r\nhello\r\nzz\r\n", "the upstream sent a bad chunk size: b'zz'"),
        (b"5\r\nhelloXX0\r\n\r\n", "the upstream's chunk does not end where its size says"),
        (b"5\r\nhello\rX0\r\n\r\n", "the upstream's chunk does not end where its size says"),
        (b"5\r\nhello\r\n" + b"1" * 1100, "the upstream's chunk-size line is too long"),
        (b"5\r\nhel", "the upstream closed the connection mid-reply"),
    ],
)
def test_each_broken_body_ends_with_the_python_relays_error(body: bytes, says: str) -> None:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    for k in (0, 1):
        for out_chunked in (False, True):
            _same(head, [body[:3], body[3:]], True, k, out_chunked)

    async def pumped_end() -> tuple:
        got = await _pumped(head, [body[:3], body[3:]], True, 0, False)
        assert got is not None
        return got[1]

    assert asyncio.run(pumped_end()) == ("broke", says)


def test_a_big_body_that_came_with_the_head_goes_first_in_pieces_of_one_read() -> None:
    data = bytes(range(256)) * 1024  # 256 KiB: four of the pump's reads
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (len(data) + 5)
    for out_chunked in (False, True):
        _same(head, [data[:1000], data[1000:], b"tail!"], True, 2, out_chunked)


def test_a_feed_that_starts_shedding_stops_the_pumps_recording_and_ends_the_exchange_as_shed() -> None:
    """What ``feed.chunk`` does for the Python relay: once the pipe is past its limit, the pieces of
    an exchange being relayed stop going to the feed, and its end is SHED."""
    token = b'data: {"choices":[{"index":0,"delta":{"content":" x"}}]}\n\n'
    body = orjson.dumps({"messages": [{"role": "user", "content": "a"}], "stream": True})

    async def main() -> tuple[list[tuple], PumpEnd, bytes]:
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        feed = ExchangeFeed(max_unsent_bytes=4 << 20)
        await feed.connect(write_fd)
        pump = pump_module.BodyPump(feed, read_timeout_s=5.0)
        up_ours, up_theirs = socket.socketpair()
        cl_ours, cl_theirs = socket.socketpair()
        for s in (up_ours, cl_ours):
            s.setblocking(False)
        t = time.monotonic_ns()
        xid = feed.begin(t, CHAT, "k", body)
        feed.head(xid, 200, "text/event-stream", "")
        state = BodyState(up_ours.fileno(), False, True, -1, 0, b"", b"")
        relayed = asyncio.ensure_future(pump.relay(state, cl_ours.fileno(), False, xid))
        up_theirs.sendall(token)
        await asyncio.sleep(0.05)
        other = feed.begin(
            t, CHAT, "k2", orjson.dumps({"messages": [{"role": "user", "content": "y" * (8 << 20)}]})
        )
        feed.flush()
        assert feed.shedding  # nothing reads the pipe yet
        up_theirs.sendall(token)
        up_theirs.shutdown(socket.SHUT_WR)
        end = await asyncio.wait_for(relayed, 5)
        feed.end(xid, t, REPLIED)
        feed.end(other, t, REPLIED)
        feed.close()
        pump.close()
        events = await read_events_to_end(read_fd)
        client = cl_theirs.recv(1 << 16)
        for s in (up_ours, up_theirs, cl_ours, cl_theirs):
            s.close()
        return events, end, client

    events, end, client = asyncio.run(main())
    assert end.body == BODY_DONE_NO_REUSE and client == token * 2  # the client got every piece
    assert [e[3] for e in events if e[0] == CHUNK] == [token]  # the feed only those before the limit
    assert [e[3] for e in events if e[0] == END and e[1] == 1] == [SHED]  # the pumped exchange
