"""The capture proxy's upstream connections against scripted raw HTTP servers on 127.0.0.1.

Each server writes exact bytes (any framing, any split, any fault), so the body the sink receives
is checked byte for byte against what the server meant to send, and each fault against the error
it must raise. One test runs the real proxy process against a port nothing listens on (502).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import socket
import time
from collections.abc import Awaitable, Callable

import pytest
import uvloop
from aiohttp import web
from yarl import URL

from loadgen.capture.feed import BEGIN, CHUNK, END, HEAD, REPLIED, UPSTREAM_BROKE, ExchangeFeed
from loadgen.capture.process import CaptureProcess
from loadgen.capture.proxy import CaptureProxy
from loadgen.capture.pump import RELAY
from loadgen.capture.upstream import UpstreamError, UpstreamPool
from tests.unit.test_capture_feed import read_events_to_end

BODY = b'data: {"choices":[{"index":0,"delta":{"content":" hi"}}]}\n\ndata: [DONE]\n\n'
# The relays that move reply bodies: the compiled pump where it is built, and the Python one.
RELAYS = ["compiled", "python"] if RELAY == "compiled" else ["python"]
Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            await reader.readexactly(int(line.split(b":")[1]))
    return head


class RawServer:
    """Serves ``script(reader, writer, n)`` per request; n counts requests on that connection."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections = 0
        self.heads: list[bytes] = []

    async def __aenter__(self) -> RawServer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = URL(f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            n = 0
            while True:
                try:
                    self.heads.append(await _read_request(reader))
                except asyncio.IncompleteReadError:
                    return
                await self.script(reader, writer, n)
                n += 1
                if writer.is_closing():
                    return
        finally:
            writer.close()


def _pool(server: RawServer, read_timeout_s: float = 5.0) -> UpstreamPool:
    return UpstreamPool(server.url, connect_timeout_s=2.0, read_timeout_s=read_timeout_s)


async def _fetch(pool: UpstreamPool, method: str = "GET", body: bytes = b"") -> tuple[int, bytes]:
    reply = await pool.request(method, "/v1/x?q=1", [("X-Custom", "v")], body)
    got: list[bytes] = []

    def sink(piece: bytes, chunk: bytes | None) -> None:
        got.append(piece)
        if chunk is not None:  # the piece in its upstream chunked framing, exactly
            size, _, rest = chunk.partition(b"\r\n")
            assert int(size, 16) == len(piece) and rest == piece + b"\r\n", (piece, chunk)

    reply.start(sink)
    try:
        while not await asyncio.wait_for(reply.wait(), 5):
            reply.resume()
    finally:
        reply.release()
    return reply.status, b"".join(got)


def _chunked(body: bytes, *sizes: int) -> bytes:
    out, pos = [], 0
    for size in sizes:
        out.append(b"%X;ext=1\r\n%b\r\n" % (size, body[pos : pos + size]))
        pos += size
    return b"".join(out) + b"0\r\nX-Trailer: t\r\n\r\n"


def test_bodies_arrive_byte_for_byte_however_the_reply_is_split_and_connections_are_reused() -> None:
    chunked = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunked += _chunked(BODY, 5, 40, len(BODY) - 45)
    sized = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%b" % (len(BODY), BODY)
    replies = [chunked, sized]
    split = {"at": 0}

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        if n == 0:  # a stream as servers write one: a head, then each chunk in a read of its own
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for piece in (BODY[:7], BODY[7:-14], BODY[-14:], b""):
                await asyncio.sleep(0.001)
                writer.write(b"%x\r\n%b\r\n" % (len(piece), piece))
            await writer.drain()
            return
        raw = replies[n % 2]
        at = split["at"] % len(raw)
        writer.write(raw[:at])
        await writer.drain()
        await asyncio.sleep(0.001)  # the two parts arrive in two reads
        writer.write(raw[at:])
        await writer.drain()

    async def main() -> None:
        async with RawServer(script) as server:
            pool = _pool(server)
            assert await _fetch(pool) == (200, BODY)
            for at in range(0, len(chunked), 3):
                split["at"] = at
                assert await _fetch(pool) == (200, BODY), at
                assert await _fetch(pool) == (200, BODY), at
            assert server.connections == 1  # every request went over the same kept-alive connection
            head = server.heads[0].decode()
            assert head.startswith("GET /v1/x?q=1 HTTP/1.1\r\nHost: 127.0.0.1:") and "X-Custom: v\r\n" in head
            pool.close()

    asyncio.run(main())


def test_a_body_to_the_close_ends_there_and_its_connection_is_not_reused() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n" + BODY)
        await writer.drain()
        writer.close()

    async def main() -> None:
        async with RawServer(script) as server:
            pool = _pool(server)
            assert await _fetch(pool) == (200, BODY)
            assert await _fetch(pool) == (200, BODY)
            assert server.connections == 2
            pool.close()

    asyncio.run(main())


@pytest.mark.parametrize(
    ("reply", "says"),
    [
        (b"HELLO\r\n\r\n", "not HTTP/1.x"),
        (b"HTTP/1.1 200 OK\r\n bad\r\n\r\n", "malformed header"),
        (b"HTTP/1.1 200 OK\r\nX-A: a\nX-B: b\r\n\r\n", "malformed header"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\n", "bad Content-Length"),
        (b"HTTP/1.1 101 Switching Protocols\r\n\r\n", "switched protocols"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 3", "closed the connection mid-head"),
        (b"", "closed the connection before replying"),
    ],
)
def test_a_broken_head_is_an_upstream_error(reply: bytes, says: str) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        writer.write(reply)
        await writer.drain()
        writer.close()

    async def main() -> None:
        async with RawServer(script) as server:
            with pytest.raises(UpstreamError, match=says):
                await _pool(server).request("POST", "/", [], b"{}")

    asyncio.run(main())


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n", "bad chunk size"),
        (b"Transfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n", "bad chunk size"),
        (b"Transfer-Encoding: chunked\r\n\r\n3\r\nhello\r\n", "does not end where its size says"),
        (b"Transfer-Encoding: chunked\r\n\r\n5\r\nhel", "closed the connection mid-reply"),
        (b"Content-Length: 10\r\n\r\nhel", "closed the connection mid-reply"),
    ],
)
def test_a_broken_body_is_an_upstream_error_after_what_came_whole(body: bytes, says: str) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\n" + body)
        await writer.drain()
        await asyncio.sleep(0.01)
        writer.close()

    async def main() -> None:
        async with RawServer(script) as server:
            reply = await _pool(server).request("GET", "/", [], b"")
            got: list[bytes] = []
            reply.start(lambda piece, chunk: got.append(piece))
            with pytest.raises(UpstreamError, match=says):
                await asyncio.wait_for(reply.wait(), 5)
            reply.release()
            assert b"".join(got) in (b"", b"hel", b"hello")

    asyncio.run(main())


def test_silence_past_the_read_timeout_and_an_unreachable_upstream_are_upstream_errors() -> None:
    served = []

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        if not served:  # the first request: a head, one piece, then silence; the next: silence
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n")
        served.append(n)
        await asyncio.sleep(2)

    async def main() -> None:
        async with RawServer(script) as server:
            pool = _pool(server, read_timeout_s=0.2)
            t0 = time.monotonic()
            reply = await pool.request("GET", "/", [], b"")
            reply.start(lambda piece, chunk: None)
            with pytest.raises(UpstreamError, match=r"sent nothing for 0\.2s"):
                await asyncio.wait_for(reply.wait(), 5)
            reply.release()
            assert 0.2 <= time.monotonic() - t0 < 1.5
            with pytest.raises(UpstreamError, match=r"sent nothing for 0\.2s"):  # no head at all
                await pool.request("GET", "/", [], b"")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            closed = URL(f"http://127.0.0.1:{s.getsockname()[1]}")  # bound, not listening: refused
            with pytest.raises(UpstreamError, match=r"cannot connect to 127\.0\.0\.1"):
                await UpstreamPool(closed, connect_timeout_s=2, read_timeout_s=2).request("GET", "/", [], b"")

    asyncio.run(main())


def test_a_kept_alive_connection_closed_before_replying_retries_only_idempotent_requests() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        if n == 0:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
        else:  # the second request on a connection: hang up without a reply (a keep-alive race)
            writer.close()

    async def main() -> None:
        async with RawServer(script) as server:
            pool = _pool(server)
            assert await _fetch(pool) == (200, b"ok")
            assert await _fetch(pool) == (200, b"ok")  # GET: sent again on a new connection
            assert server.connections == 2
            with pytest.raises(UpstreamError, match="before replying"):  # POST: never sent twice
                await _fetch(pool, "POST", b"{}")
            assert server.connections == 2
            pool.close()

    asyncio.run(main())


def test_a_client_slower_than_the_upstream_pauses_it_and_gets_every_byte() -> None:
    big = bytes(range(256)) * 4096  # 1 MiB

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(big))
        for i in range(0, len(big), 65536):
            writer.write(big[i : i + 65536])
            await writer.drain()

    async def main() -> None:
        async with RawServer(script) as server:
            pool = _pool(server)
            reply = await pool.request("GET", "/", [], b"")
            got: list[bytes] = []
            pauses = 0

            def sink(piece: bytes, chunk: bytes | None) -> None:
                got.append(piece)
                reply.pause()  # as the proxy does when the client's write buffer is full

            reply.start(sink)
            while not await asyncio.wait_for(reply.wait(), 5):
                pauses += 1
                await asyncio.sleep(0)
                reply.resume()
            reply.release()
            assert b"".join(got) == big and pauses >= 2
            pool.close()

    asyncio.run(main())


def test_the_proxy_answers_502_with_an_error_body_when_the_upstream_is_unreachable(tmp_path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        cap = CaptureProcess.start(
            ["--upstream", f"http://127.0.0.1:{port}", "--out", str(tmp_path / "c.jsonl")]
        )
        try:
            conn = http.client.HTTPConnection("127.0.0.1", cap.port, timeout=10)
            conn.request("POST", "/v1/chat/completions", body=b'{"messages":[{"role":"user","content":"x"}]}')
            resp = conn.getresponse()
            err = json.loads(resp.read())["error"]
            conn.close()
        finally:
            assert cap.stop() == 0, cap.stderr()
    assert resp.status == 502 and err["code"] == 502 and err["type"] == "bad_gateway"
    assert err["message"].startswith(
        f"capture proxy: upstream unreachable: cannot connect to 127.0.0.1:{port}"
    )
    assert "1 failed upstream" in cap.output, cap.output


def _peak_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


@pytest.mark.parametrize("relay", RELAYS)
def test_the_proxy_holds_a_fast_upstream_back_for_a_slow_client_and_forwards_every_byte(
    tmp_path, relay, monkeypatch
) -> None:
    monkeypatch.setenv("LOADGEN_RELAY", relay)  # the capture child's relay (pump.py)
    big = bytes(range(256)) * (48 * 4096)  # 48 MiB: far past what the sockets between can buffer

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(big))
        for i in range(0, len(big), 1 << 20):
            writer.write(big[i : i + (1 << 20)])
            await writer.drain()

    async def main() -> None:
        async with RawServer(script) as server:
            cap = await asyncio.to_thread(
                CaptureProcess.start, ["--upstream", str(server.url), "--out", str(tmp_path / "c.jsonl")]
            )
            try:
                rss_before = _peak_rss_kib(cap.proc.pid)
                reader, writer = await asyncio.open_connection("127.0.0.1", cap.port)
                writer.write(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
                assert head.startswith(b"HTTP/1.1 200") and b"Content-Length: %d" % len(big) in head
                got = bytearray()
                async with asyncio.timeout(20):
                    while len(got) < len(big):
                        got += await reader.read(1 << 20)
                        await asyncio.sleep(0.002)  # a client slower than the upstream
                writer.close()
                assert got == big
                # Without holding the upstream back the proxy would buffer most of the body.
                grew_mib = (_peak_rss_kib(cap.proc.pid) - rss_before) / 1024
                assert grew_mib < 16, grew_mib
            finally:
                assert await asyncio.to_thread(cap.stop) == 0

    asyncio.run(main())


@pytest.mark.parametrize("relay", RELAYS)
def test_a_client_that_stops_reading_is_cut_after_the_read_timeout_and_its_upstream_closed(relay) -> None:
    big = b"x" * (64 << 20)  # more than the sockets can buffer, so the proxy must wait for the client
    upstream_closed: list[float] = []

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(big))
        try:
            for i in range(0, len(big), 1 << 20):
                writer.write(big[i : i + (1 << 20)])
                await writer.drain()
        except ConnectionError:
            upstream_closed.append(time.monotonic())

    async def main() -> None:
        async with RawServer(script) as server:
            proxy = CaptureProxy(
                server.url, ExchangeFeed(), session_header="X-Session-ID",
                connect_timeout_s=2, read_timeout_s=0.3, relay=relay,
            )  # fmt: skip
            runner = web.AppRunner(proxy.app, access_log=None, handler_cancellation=True, shutdown_timeout=2)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            reader, writer = await asyncio.open_connection("127.0.0.1", runner.addresses[0][1])
            try:
                writer.write(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
                t_sent = time.monotonic()
                async with asyncio.timeout(5):  # read nothing until the proxy gives up on us
                    while not upstream_closed:
                        await asyncio.sleep(0.02)
                assert upstream_closed[0] - t_sent >= 0.3  # not before the client's 0.3 s were up
                got = 0
                async with asyncio.timeout(10):
                    try:
                        while data := await reader.read(1 << 20):
                            got += len(data)
                    except ConnectionError:
                        pass
                assert 0 < got < len(big)  # what the sockets held, then the cut
            finally:
                writer.close()
                await runner.cleanup()

    asyncio.run(main())


# Replies as scripted writes (None: a pause, so the next write arrives in a read of its own; a
# number: silence for that many seconds, past the proxy's read timeout), then whether the upstream
# closes its connection. Each goes through the real proxy on both relays.
FEED_READ_TIMEOUT_S = 0.5
SSE = b'data: {"choices":[{"index":0,"delta":{"content":" hi"}}]}\n\n'
FEED_SCRIPTS = {
    "chunked, cut anywhere, reused": (
        [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3", None, b"A;e=1\r\n" + SSE[:30], None,
         SSE[30:] + b"\r", None, b"\n00A\r\n" + SSE[:10] + b"\r\n0\r\nX-T: 1\r", None, b"\n\r\n"],
        False,
    ),
    "chunked with the body in the head's read": (
        [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%b\r\n" % (len(SSE), SSE), None,
         b"%x\r\n%b\r\n0\r\n\r\n" % (len(SSE), SSE)],
        False,
    ),
    "content-length": (
        [b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (3 * len(SSE)), SSE, None, SSE * 2],
        False,
    ),
    "to the close": ([b"HTTP/1.1 200 OK\r\n\r\n", SSE, None, SSE, None, SSE], True),
    "bad chunk size mid-stream": (
        [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", b"%x\r\n%b\r\n" % (len(SSE), SSE), None,
         b"zz\r\n" + SSE],
        False,
    ),
    "cut mid-chunk": (
        [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", b"%x\r\n%b\r\n" % (len(SSE), SSE), None,
         b"%x\r\n%b" % (len(SSE), SSE[:9])],
        True,
    ),
    "silent past the read timeout": (
        [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", b"%x\r\n%b\r\n" % (len(SSE), SSE), 1.0],
        False,
    ),
    "bytes after the end": (
        [b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(SSE), SSE + b"HTTP/1.1 200 OK\r\n"],
        False,
    ),
}  # fmt: skip


async def _through_proxy(relay: str, writes: list[bytes | float | None], close: bool) -> tuple:
    """(client status line, body as the client de-framed it, whether it was cut, the feed's events
    for the exchange: kinds in order, the joined pieces, the outcome), and the upstream's
    connection count after a second request."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        for w in writes:
            if w is None or isinstance(w, float):
                await writer.drain()
                await asyncio.sleep(0.01 if w is None else w)
            else:
                writer.write(w)
        await writer.drain()
        if close:
            writer.close()

    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    async with RawServer(script) as server:
        feed = ExchangeFeed()
        await feed.connect(write_fd)
        proxy = CaptureProxy(
            server.url, feed, session_header="X-Session-ID", connect_timeout_s=2,
            read_timeout_s=FEED_READ_TIMEOUT_S, relay=relay,
        )  # fmt: skip
        runner = web.AppRunner(proxy.app, access_log=None, handler_cancellation=True, shutdown_timeout=2)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        port = runner.addresses[0][1]
        try:
            got = [await _post_raw(port) for _ in range(2)]
        finally:
            await runner.cleanup()
            feed.close()  # written whole, then the pipe closed: the reader reads to its end
        events = await read_events_to_end(read_fd)
    exchanges = []
    for xid in sorted({e[1] for e in events}):
        mine = [e for e in events if e[1] == xid]
        pieces = b"".join(e[3] for e in mine if e[0] == CHUNK)
        kinds = [e[0] for e in mine if e[0] != CHUNK]
        exchanges.append((kinds, pieces, mine[-1][3]))
    return got, exchanges, server.connections


async def _post_raw(port: int) -> tuple[bytes, bytes, bool]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = b'{"messages":[{"role":"user","content":"hi"}],"stream":true}'
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%b"
        % (len(body), body)
    )
    raw = b""
    async with asyncio.timeout(10):
        try:
            while data := await reader.read(1 << 16):
                raw += data
        except ConnectionError:
            pass
    writer.close()
    head, _, rest = raw.partition(b"\r\n\r\n")
    status = head.split(b"\r\n")[0]
    if b"transfer-encoding: chunked" not in head.lower():
        return status, rest, False
    out, pos = b"", 0
    while True:  # de-chunk what came; a reply without its last chunk was cut
        eol = rest.find(b"\r\n", pos)
        if eol < 0:
            return status, out, True
        size = int(rest[pos:eol], 16)
        if size == 0:
            return status, out, False
        if len(rest) < eol + 4 + size:
            return status, out + rest[eol + 2 : eol + 2 + size], True
        out += rest[eol + 2 : eol + 2 + size]
        pos = eol + 4 + size


@pytest.mark.skipif(RELAY != "compiled", reason="the relay pump is not built (make setup builds it)")
@pytest.mark.parametrize("name", list(FEED_SCRIPTS))
def test_both_relays_give_the_client_and_the_feed_the_same_exchange(name: str) -> None:
    writes, close = FEED_SCRIPTS[name]

    def run(relay: str) -> tuple:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:  # as `loadgen capture` runs
            return runner.run(_through_proxy(relay, writes, close))

    compiled, python = run("compiled"), run("python")
    assert compiled == python, name
    (client, exchanges, connections) = python
    assert len(exchanges) == 2 and all(kinds == [BEGIN, HEAD, END] for kinds, _, _ in exchanges)
    for (status, body, cut), (_, pieces, outcome) in zip(client, exchanges, strict=True):
        assert status == b"HTTP/1.1 200 OK" and body.startswith(SSE[:9]) and pieces == body
        assert outcome == (UPSTREAM_BROKE if cut else REPLIED), (name, cut, outcome)
    # The upstream's connection carries the second request only after a body that ended cleanly.
    reusable = not close and not any(cut for _, _, cut in client) and "after the end" not in name
    assert connections == (1 if reusable else 2), (name, connections)
