"""The capture proxy's relay: forwards every request to the upstream unchanged, and only moves bytes.

Every method and path is forwarded (``/v1/models``, ``/health``, ``/metrics`` too). The request
body goes upstream as received; the reply's status, headers (less hop-by-hop ones) and body bytes
come back as the upstream sent them, each chunk written to the client as soon as it arrives.
Nothing is parsed here: for a recorded request (``apis.endpoint_of``: ``POST`` of chat
completions, completions, Messages or Responses) the request, the reply's head and every piece the client got (with when it went out) go to an
``ExchangeFeed`` (``feed.py``), which hands them to the assembler process in batches.

aiohttp serves the client and writes the reply's head; the body's pieces go from the upstream
connection's read callback (``upstream.py``) straight to the client's transport (in the upstream's
own chunk when a read was exactly one, else framed here), so a streamed token costs one socket
read, one socket write and a list append, with no coroutine step. A client slower than the
upstream pauses the upstream's reading until it catches up; one that reads nothing for the read
timeout is cut.

Failures: an upstream that cannot be reached gets the client a 502 with an OpenAI-style error
body; an upstream error reply (any non-2xx) is passed through as it is; an upstream that breaks
off mid-reply has the client connection cut too, so the client sees a cut, not a clean end. A
client that goes away mid-reply cancels the upstream request (its connection is closed). The
exchange's end event says which of these happened (``feed.OUTCOMES``); the assembler decides what
is recorded.
"""

from __future__ import annotations

import asyncio
import time

import orjson
from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from yarl import URL

from loadgen.capture.apis import endpoint_of
from loadgen.capture.feed import (
    CLIENT_LEFT,
    LEFT_BEFORE_HEAD,
    REPLIED,
    UNREACHABLE,
    UPSTREAM_BROKE,
    ExchangeFeed,
)
from loadgen.capture.pump import RELAY, BodyPump
from loadgen.capture.upstream import UpstreamError, UpstreamPool, UpstreamReply
from loadgen.capture.upstream_connection import BODY_BROKE

# RFC 9110 7.6.1 connection-specific fields, plus the framing ones each hop sets for itself.
HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate", "Proxy-Authorization",
        "TE", "Trailer", "Transfer-Encoding", "Upgrade", "Host", "Content-Length",
    )
)  # fmt: skip
# The largest request body accepted (long agent contexts run to megabytes).
MAX_REQUEST_BYTES = 256 * 1024 * 1024


class _Exchange:
    """A recorded exchange on the wire: its id in the feed (0: not recorded) and how it ended."""

    __slots__ = ("outcome", "xid")

    def __init__(self, xid: int) -> None:
        self.xid = xid
        self.outcome = LEFT_BEFORE_HEAD  # until the reply's head is in


class CaptureProxy:
    """The aiohttp application of the relay; its upstream connections close with it."""

    def __init__(
        self,
        upstream: URL,
        feed: ExchangeFeed,
        *,
        session_header: str,
        connect_timeout_s: float,
        read_timeout_s: float,
        relay: str | None = None,
    ) -> None:
        self.upstream = upstream
        self.feed = feed
        self.session_header = session_header
        self.read_timeout_s = read_timeout_s  # also how long a client may leave the reply unread
        # Only the client's own headers go upstream (an added Accept-Encoding would get the client
        # a compressed body it never asked for), and bytes come back as the upstream encoded them.
        self._upstream = UpstreamPool(
            upstream, connect_timeout_s=connect_timeout_s, read_timeout_s=read_timeout_s
        )
        # The reply bodies go through the compiled pump where it is built (pump.py), else through
        # _ClientSink below, the reference; a TLS upstream always takes the sink.
        self.relay = RELAY if relay is None else relay
        self._pump = BodyPump(feed, read_timeout_s) if self.relay == "compiled" else None
        self.app = web.Application(client_max_size=MAX_REQUEST_BYTES)
        self.app.router.add_route("*", "/{tail:.*}", self.handle)
        self.app.on_cleanup.append(self._close_upstream)

    async def _close_upstream(self, _app: web.Application) -> None:
        self._upstream.close()
        if self._pump is not None:
            self._pump.close()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        t_request_ns = time.monotonic_ns()
        body = await request.read()
        endpoint = endpoint_of(request.method, request.path)
        xid = 0
        if endpoint is not None:
            key = request.headers.get(self.session_header)
            xid = self.feed.begin(t_request_ns, endpoint, key, body)
        ex = _Exchange(xid)
        try:
            return await self._forward(request, body, ex)
        finally:
            if xid:
                self.feed.end(xid, time.monotonic_ns(), ex.outcome)

    async def _forward(self, request: web.Request, body: bytes, ex: _Exchange) -> web.StreamResponse:
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP]
        try:
            upstream = await self._upstream.request(request.method, request.raw_path, headers, body)
        except UpstreamError as e:
            ex.outcome = UNREACHABLE
            return web.Response(
                status=502,
                body=orjson.dumps({"error": {"message": f"capture proxy: upstream unreachable: {e}",
                                             "type": "bad_gateway", "code": 502}}),
                content_type="application/json",
            )  # fmt: skip
        # (cancelled while the upstream had not answered: the outcome stays LEFT_BEFORE_HEAD)
        try:
            return await self._relay(request, upstream, ex)
        finally:
            upstream.release()  # to the pool if read to its end, else closed (which stops the upstream)

    async def _relay(
        self, request: web.Request, upstream: UpstreamReply, ex: _Exchange
    ) -> web.StreamResponse:
        resp = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        for k, v in upstream.headers.items():
            if k.lower() not in HOP_BY_HOP:
                resp.headers.add(k, v)
        if upstream.content_length is not None:
            resp.content_length = upstream.content_length
        xid = ex.xid
        if xid:
            self.feed.head(
                xid, upstream.status, upstream.headers.get("Content-Type", ""),
                upstream.headers.get("Content-Encoding", ""),
            )  # fmt: skip
            if not 200 <= upstream.status < 300:
                xid = 0  # an error reply is never recorded: its body need not travel
        ex.outcome = CLIENT_LEFT  # until the reply is whole
        try:
            writer = await resp.prepare(request)
            transport = request.transport
            if writer is None or transport is None:
                raise ConnectionResetError("the client left before the reply's head went out")
            body, client = None, transport.get_extra_info("socket")
            if (
                self._pump is not None
                and client is not None
                and transport.get_extra_info("sslcontext") is None  # the pump writes the socket's own bytes
                and transport.get_write_buffer_size() == 0  # nothing of aiohttp's still queued before it
            ):
                body = upstream.hand_over()  # (None: TLS, or the body is already whole)
            if body is not None:
                end = await self._pump.relay(body, client.fileno(), writer.chunked, xid)
                if end.body is None:  # the client went away, or stopped reading and is cut
                    if end.client_stalled:
                        transport.close()
                    raise ConnectionResetError(end.message)
                upstream.taken_back(end.body, end.message)
                if end.body == BODY_BROKE:
                    raise UpstreamError(end.message or "the upstream broke off mid-reply")
                await resp.write_eof()
                ex.outcome = REPLIED
                return resp
            sink = _ClientSink(transport, request.protocol, writer.chunked, self.feed, xid, upstream)
            upstream.start(sink.write)
            while not await upstream.wait():  # False: reading paused until the client catches up
                if sink.client_gone:
                    raise ConnectionResetError("the client left mid-reply")
                try:
                    async with asyncio.timeout(self.read_timeout_s):
                        await writer.drain()
                except TimeoutError:  # a client that stopped reading: cut it, free the upstream
                    transport.close()
                    raise ConnectionResetError("the client stopped reading") from None
                upstream.resume()
            if sink.client_gone:
                raise ConnectionResetError("the client left mid-reply")
            await resp.write_eof()
        except UpstreamError:
            # The upstream broke off: cut the client too rather than end the reply cleanly.
            ex.outcome = UPSTREAM_BROKE
            if request.transport is not None:
                request.transport.close()
            return resp
        except ConnectionError:  # the client went away: a write failed
            return resp
        ex.outcome = REPLIED
        return resp


class _ClientSink:
    """Writes each piece of the upstream's body to the client's transport as it arrives (in
    HTTP/1.1 chunked framing when aiohttp chose it for the reply), then hands it to the feed.

    It runs inside the upstream connection's read callback. A client whose transport closed, or
    whose write buffer is past its high-water mark, pauses the upstream (``UpstreamReply.pause``);
    the relay then drains or ends. Only pieces the client was sent go to the feed."""

    __slots__ = ("_chunked", "_feed", "_protocol", "_transport", "_upstream", "_xid", "client_gone")

    def __init__(
        self,
        transport: asyncio.Transport,
        protocol: RequestHandler,
        chunked: bool,
        feed: ExchangeFeed,
        xid: int,
        upstream: UpstreamReply,
    ) -> None:
        self._transport = transport
        self._protocol = protocol
        self._chunked = chunked
        self._feed = feed
        self._xid = xid  # 0: the pieces are not recorded
        self._upstream = upstream
        self.client_gone = False

    def write(self, data: bytes, chunk: bytes | None = None) -> None:
        transport = self._transport
        if transport.is_closing():
            self.client_gone = True
            self._upstream.pause()
            return
        out = data
        if self._chunked:  # the upstream's own chunk when it came as one, else framed here
            out = chunk if chunk is not None else b"%x\r\n%b\r\n" % (len(data), data)
        if self._xid:
            t_piece_ns = time.monotonic_ns()  # stamped before the write: never after the client has it
            transport.write(out)
            self._feed.chunk(self._xid, t_piece_ns, data)
        else:
            transport.write(out)
        if self._protocol.writing_paused:
            self._upstream.pause()
