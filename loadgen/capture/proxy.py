"""The capture proxy: forwards every request to the upstream unchanged and records chat turns.

Every method and path is forwarded (``/v1/models``, ``/health``, ``/metrics`` too). The request
body goes upstream as received; the reply's status, headers (less hop-by-hop ones) and body bytes
come back as the upstream sent them, each chunk written to the client as soon as it arrives, then
read on the side by a ``ReplyMeter``. ``POST`` bodies of ``/v1/chat/completions`` and
``/v1/completions`` also go to the ``SessionAssembler``.

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

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from loadgen.capture.assembly import CHAT, COMPLETIONS, PendingTurn, SessionAssembler
from loadgen.capture.reply import ReplyMeter

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
    """The aiohttp application of the proxy; its upstream client session opens and closes with it."""

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
        self._timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout_s, sock_read=read_timeout_s)
        self._client: aiohttp.ClientSession | None = None
        self.app = web.Application(client_max_size=MAX_REQUEST_BYTES)
        self.app.router.add_route("*", "/{tail:.*}", self.handle)
        self.app.on_startup.append(self._open_client)
        self.app.on_cleanup.append(self._close_client)

    async def _open_client(self, _app: web.Application) -> None:
        self._client = aiohttp.ClientSession(
            timeout=self._timeout,
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=None),
            auto_decompress=False,  # bytes go to the client as the upstream encoded them
            # Send only the client's own headers: an added Accept-Encoding would get the client a
            # compressed body it never asked for.
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
        )

    async def _close_client(self, _app: web.Application) -> None:
        if self._client is not None:
            await self._client.close()

    def _url(self, request: web.Request) -> URL:
        base = str(self.upstream).rstrip("/")
        return URL(base + request.raw_path, encoded=True)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        t_request = time.monotonic()
        body = await request.read()
        pending = self._begin(request, body, t_request)
        headers = CIMultiDict((k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP)
        assert self._client is not None
        try:
            upstream = await self._client.request(
                request.method, self._url(request), headers=headers, data=body or None, allow_redirects=False
            )
        except asyncio.CancelledError:  # the client left while the upstream had not answered yet
            self._drop(pending, cut=True)
            raise
        except (TimeoutError, aiohttp.ClientError, OSError) as e:
            self._drop(pending, cut=False)
            reason = str(e) or type(e).__name__
            return web.Response(
                status=502,
                body=orjson.dumps({"error": {"message": f"capture proxy: upstream unreachable: {reason}",
                                             "type": "bad_gateway", "code": 502}}),
                content_type="application/json",
            )  # fmt: skip
        try:
            return await self._relay(request, upstream, pending)
        finally:
            if upstream.content.at_eof():
                upstream.release()  # read to the end: the connection goes back to the pool
            else:
                upstream.close()  # abandoned mid-reply (the client left): closing it stops the upstream

    def _begin(self, request: web.Request, body: bytes, t_request: float) -> PendingTurn | None:
        endpoint = endpoint_of(request.method, request.path)
        if endpoint is None:
            return None
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError:
            obj = None
        return self.assembler.begin(endpoint, obj, request.headers.get(self.session_header), t_request)

    async def _relay(
        self, request: web.Request, upstream: aiohttp.ClientResponse, pending: PendingTurn | None
    ) -> web.StreamResponse:
        resp = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        for k, v in upstream.headers.items():
            if k.lower() not in HOP_BY_HOP:
                resp.headers.add(k, v)
        if upstream.content_length is not None:
            resp.content_length = upstream.content_length
        meter = None
        if pending is not None and 200 <= upstream.status < 300:
            meter = ReplyMeter(
                CHAT if pending.prompt is None else COMPLETIONS,
                content_type=upstream.headers.get("Content-Type", ""),
                content_encoding=upstream.headers.get("Content-Encoding", ""),
            )
        t_done = None  # when the chunk holding the stream's [DONE] went to the client
        try:
            await resp.prepare(request)
            while True:
                try:
                    chunk = await upstream.content.readany()
                except (TimeoutError, aiohttp.ClientError, OSError):
                    # The upstream broke off: cut the client too rather than end the reply cleanly.
                    if meter is not None and meter.stream_done:  # after its [DONE]: the reply is whole
                        self._settle(pending, meter, client_left=False, t_done=t_done)
                    else:
                        self._drop(pending, cut=False)
                    if request.transport is not None:
                        request.transport.close()
                    return resp
                if not chunk:
                    break
                t_chunk = time.monotonic()  # stamped before the write: never after the client has it
                await resp.write(chunk)
                if meter is not None:
                    meter.feed(chunk)
                    if t_done is None and meter.stream_done:
                        t_done = t_chunk
            await resp.write_eof()
        except ConnectionError:  # the client went away: a write failed
            self._settle(pending, meter, client_left=True, t_done=t_done)
            return resp
        except asyncio.CancelledError:  # the client went away while we waited (or shutdown)
            self._settle(pending, meter, client_left=True, t_done=t_done)
            raise
        self._settle(pending, meter, client_left=False, t_done=t_done)
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
