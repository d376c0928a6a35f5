"""The capture proxy: forwards every request to the upstream unchanged and records chat turns.

Every method and path is forwarded (``/v1/models``, ``/health``, ``/metrics`` too). The request
body goes upstream as received; the reply's status, headers (less hop-by-hop ones) and body bytes
come back as the upstream sent them, each chunk written to the client as soon as it arrives, then
read on the side by a ``ReplyMeter``. ``POST`` bodies of ``/v1/chat/completions`` and
``/v1/completions`` also go to the ``SessionAssembler``.

aiohttp serves the client and writes the reply's head; the body's pieces go from the upstream
connection's read callback (``upstream.py``) straight to the client's transport (in the upstream's
own chunk when a read was exactly one, else framed here), so a streamed token costs one socket
read, one socket write and the meter's line split, with no coroutine step; the meter parses the
lines later, a slice at a time between relays (``reply.ParseBacklog``). A client slower than the
upstream pauses the upstream's reading until it catches up; one that reads nothing for the read
timeout is cut.

Failures: an upstream that cannot be reached gets the client a 502 with an OpenAI-style error
body; an upstream error reply (any non-2xx) is passed through as it is; an upstream that breaks
off mid-reply has the client connection cut too, so the client sees a cut, not a clean end. A
client that goes away mid-reply cancels the upstream request (its connection is closed). In every
such case the turn is dropped, never half-recorded, unless the stream's ``[DONE]`` had already gone
by: then the reply was whole and it counts.
"""

from __future__ import annotations

import asyncio
import time

import orjson
from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from yarl import URL

from loadgen.capture.assembly import CHAT, COMPLETIONS, PendingTurn, SessionAssembler
from loadgen.capture.reply import ParseBacklog, ReplyMeter
from loadgen.capture.upstream import UpstreamError, UpstreamPool, UpstreamReply

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


def endpoint_of(method: str, path: str) -> str | None:
    """Which recorded endpoint a request is, if any."""
    if method != "POST":
        return None
    if path.endswith("/chat/completions"):
        return CHAT
    if path.endswith("/completions"):
        return COMPLETIONS
    return None


class CaptureProxy:
    """The aiohttp application of the proxy; its upstream connections close with it."""

    def __init__(
        self,
        upstream: URL,
        assembler: SessionAssembler,
        *,
        session_header: str,
        connect_timeout_s: float,
        read_timeout_s: float,
    ) -> None:
        self.upstream = upstream
        self.assembler = assembler
        self.session_header = session_header
        self.read_timeout_s = read_timeout_s  # also how long a client may leave the reply unread
        # Only the client's own headers go upstream (an added Accept-Encoding would get the client
        # a compressed body it never asked for), and bytes come back as the upstream encoded them.
        self._upstream = UpstreamPool(
            upstream, connect_timeout_s=connect_timeout_s, read_timeout_s=read_timeout_s
        )
        self._backlog: ParseBacklog | None = None  # made on the loop, at the first reply
        self.app = web.Application(client_max_size=MAX_REQUEST_BYTES)
        self.app.router.add_route("*", "/{tail:.*}", self.handle)
        self.app.on_cleanup.append(self._close_upstream)

    async def _close_upstream(self, _app: web.Application) -> None:
        self._upstream.close()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        t_request = time.monotonic()
        body = await request.read()
        obj, pending = self._begin(request, body, t_request)
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP]
        try:
            upstream = await self._upstream.request(request.method, request.raw_path, headers, body)
        except asyncio.CancelledError:  # the client left while the upstream had not answered yet
            self._drop(pending, cut=True)
            raise
        except UpstreamError as e:
            self._drop(pending, cut=False)
            return web.Response(
                status=502,
                body=orjson.dumps({"error": {"message": f"capture proxy: upstream unreachable: {e}",
                                             "type": "bad_gateway", "code": 502}}),
                content_type="application/json",
            )  # fmt: skip
        try:
            return await self._relay(request, upstream, pending, _asks_usage(obj))
        finally:
            upstream.release()  # to the pool if read to its end, else closed (which stops the upstream)

    def _begin(
        self, request: web.Request, body: bytes, t_request: float
    ) -> tuple[object, PendingTurn | None]:
        """The request body's JSON (None when there is none) and the turn it begins, if any."""
        endpoint = endpoint_of(request.method, request.path)
        if endpoint is None:
            return None, None
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError:
            obj = None
        return obj, self.assembler.begin(endpoint, obj, request.headers.get(self.session_header), t_request)

    async def _relay(
        self, request: web.Request, upstream: UpstreamReply, pending: PendingTurn | None, usage_asked: bool
    ) -> web.StreamResponse:
        resp = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        for k, v in upstream.headers.items():
            if k.lower() not in HOP_BY_HOP:
                resp.headers.add(k, v)
        if upstream.content_length is not None:
            resp.content_length = upstream.content_length
        meter = None
        if pending is not None and 200 <= upstream.status < 300:
            if self._backlog is None:
                self._backlog = ParseBacklog(asyncio.get_running_loop())
            meter = ReplyMeter(
                CHAT if pending.prompt is None else COMPLETIONS,
                content_type=upstream.headers.get("Content-Type", ""),
                content_encoding=upstream.headers.get("Content-Encoding", ""),
                backlog=self._backlog,
                usage_asked=usage_asked,
            )
        sink = None
        try:
            writer = await resp.prepare(request)
            transport = request.transport
            if writer is None or transport is None:
                raise ConnectionResetError("the client left before the reply's head went out")
            sink = _ClientSink(transport, request.protocol, writer.chunked, meter, upstream)
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
            if meter is not None and meter.stream_done:  # after its [DONE]: the reply is whole
                self._settle(pending, meter, client_left=False, t_done=sink.t_done if sink else None)
            else:
                self._drop(pending, cut=False)
            if request.transport is not None:
                request.transport.close()
            return resp
        except ConnectionError:  # the client went away: a write failed
            self._settle(pending, meter, client_left=True, t_done=sink.t_done if sink else None)
            return resp
        except asyncio.CancelledError:  # the client went away while we waited (or shutdown)
            self._settle(pending, meter, client_left=True, t_done=sink.t_done if sink else None)
            raise
        self._settle(pending, meter, client_left=False, t_done=sink.t_done)
        return resp

    def _settle(
        self,
        pending: PendingTurn | None,
        meter: ReplyMeter | None,
        *,
        client_left: bool,
        t_done: float | None,
    ) -> None:
        """Record the turn if its reply is whole. A client may hang up right after ``[DONE]``,
        before the end of the body: that reply was complete and counts. The reply ended when its
        ``[DONE]`` went to the client (the body's end may come later), else at the body's end."""
        if pending is None:
            return
        if client_left and (meter is None or not meter.stream_done):
            self._drop(pending, cut=True)
            return
        reply = meter.finish() if meter is not None else None
        if reply is None:
            self._drop(pending, cut=False)
        else:
            t_end = t_done if t_done is not None else time.monotonic()
            self.assembler.complete(
                pending, output_tokens=reply.output_tokens, reply_text=reply.text, now_s=t_end
            )

    def _drop(self, pending: PendingTurn | None, *, cut: bool) -> None:
        if pending is not None:
            self.assembler.drop(pending, cut=cut, now_s=time.monotonic())


def _asks_usage(obj: object) -> bool:
    """Whether a request asked for the stream's usage (``stream_options.include_usage``)."""
    opts = obj.get("stream_options") if type(obj) is dict else None
    return type(opts) is dict and opts.get("include_usage") is True


class _ClientSink:
    """Writes each piece of the upstream's body to the client's transport as it arrives (in
    HTTP/1.1 chunked framing when aiohttp chose it for the reply), then feeds the meter.

    It runs inside the upstream connection's read callback. A client whose transport closed, or
    whose write buffer is past its high-water mark, pauses the upstream (``UpstreamReply.pause``);
    the relay then drains or ends."""

    __slots__ = ("_chunked", "_meter", "_protocol", "_transport", "_upstream", "client_gone", "t_done")

    def __init__(
        self,
        transport: asyncio.Transport,
        protocol: RequestHandler,
        chunked: bool,
        meter: ReplyMeter | None,
        upstream: UpstreamReply,
    ) -> None:
        self._transport = transport
        self._protocol = protocol
        self._chunked = chunked
        self._meter = meter
        self._upstream = upstream
        self.t_done: float | None = None  # when the piece holding the stream's [DONE] went out
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
        meter = self._meter
        if meter is None:
            transport.write(out)
        else:
            t_piece = time.monotonic()  # stamped before the write: never after the client has it
            transport.write(out)
            meter.feed(data)
            if self.t_done is None and meter.stream_done:
                self.t_done = t_piece
        if self._protocol.writing_paused:
            self._upstream.pause()
