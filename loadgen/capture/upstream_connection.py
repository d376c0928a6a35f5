"""One HTTP/1.1 connection of the capture proxy to its upstream, relaying a reply piece by piece.

``UpstreamConnection.exchange`` sends one request and returns the reply's head as an
``UpstreamReply``; ``UpstreamReply.start(sink)`` then hands each piece of the body to ``sink`` from
the connection's ``data_received``: no stream reader, future or task switch per piece, which is
what a streamed token costs a coroutine-based client. All pieces read at once (one socket read) go
as one call. Only the head and the end of the body are awaited (``UpstreamReply.wait``). When a
read was exactly one whole chunk of a chunked body, the sink gets that chunk as it came too (its
framing included), so a chunked reply can go on without being framed again.

Framing (the head parsed in ``upstream_head.py``): ``Transfer-Encoding: chunked`` (chunk
extensions and trailers dropped), else ``Content-Length``, else the body runs to the connection's
close. Replies to ``HEAD`` and 204/304 replies have none; interim 1xx replies are skipped. Bodies
pass as sent (never decompressed), and a redirect is a reply like any other (never followed).

Failures raise ``UpstreamError`` with a reason: no byte for ``read_timeout_s`` (while waiting for
the head or inside the body, not while the sink has reading paused), a malformed head or chunk, or
a close before the body's end (``ClosedBeforeReply`` when no byte of the reply came). One class,
because the head, the chunked decoder, the sink and the read deadline share one exchange's state
inside ``data_received``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import NamedTuple

from multidict import CIMultiDictProxy

from loadgen.capture.upstream_head import UpstreamError, parse_head

MAX_HEAD_BYTES = 64 * 1024  # a reply head (status line and headers) longer than this is an error
_MAX_SIZE_LINE = 1024  # a chunk-size line (with extensions) longer than this is an error
_HEX = b"0123456789abcdefABCDEF"

# What the connection is doing (``UpstreamConnection._phase``).
_IDLE, _HEAD, _BODY, _DONE = range(4)
# Where the chunked decoder is (``UpstreamConnection._chunk_state``).
_SIZE, _DATA, _DATA_END, _TRAILER = range(4)


# sink(piece, chunk): a piece of the body; chunk is the same piece in the upstream's own chunked
# framing (size line, data, CRLF) when the read was exactly that, else None.
Sink = Callable[[bytes, bytes | None], None]


class BodyState(NamedTuple):
    """Where a reply's body is, for the compiled pump to carry on from (``hand_over``)."""

    fd: int
    chunked: bool
    to_close: bool  # framed by the connection's close
    left: int  # bytes left of a Content-Length body, or of the current chunk
    chunk_state: int  # _SIZE.._TRAILER
    carry: bytes  # the chunked decoder's cut line
    early: bytes  # body that came before the hand-over, not yet given to anyone


# How a hand-over ended (``taken_back``): the pump's statuses, as loadgen/capture/_relay.c has them.
BODY_DONE, BODY_DONE_NO_REUSE, BODY_BROKE = 0, 1, 2


class ClosedBeforeReply(UpstreamError):
    """A connection closed before any byte of the reply (on a reused one: maybe a keep-alive race)."""


class UpstreamReply:
    """One reply: its head now, its body through ``start``; ``release`` hands the connection back."""

    __slots__ = ("_conn", "content_length", "headers", "reason", "status")

    def __init__(
        self, conn: UpstreamConnection, status: int, reason: str, headers: CIMultiDictProxy[str], length: int | None
    ) -> None:
        self.status = status
        self.reason = reason
        self.headers = headers
        self.content_length = length  # only when the body is framed by its Content-Length
        self._conn = conn

    def start(self, sink: Sink) -> None:
        """From now on every piece of the body goes to ``sink`` as it arrives (what came already
        goes at once). ``sink`` runs inside the connection's read callback: it must not block."""
        self._conn.start_body(sink)

    async def wait(self) -> bool:
        """True once the body has ended; False when reading was paused (``pause``). Raises
        ``UpstreamError`` when the upstream broke off or fell silent."""
        return await self._conn.wait_body()

    def pause(self) -> None:
        """Stop reading from the upstream (the client is slower); wakes ``wait`` with False."""
        self._conn.pause()

    def resume(self) -> None:
        self._conn.resume()

    def hand_over(self) -> BodyState | None:
        """Give the rest of the body to the compiled pump (``pump.py``): the connection stops
        reading, and its socket, framing and decoder state are returned. None where it cannot:
        the body already ended or failed, a sink has it, or the connection is TLS (the pump moves
        the socket's own bytes)."""
        return self._conn.hand_over()

    def taken_back(self, status: int, message: str | None) -> None:
        """The pump ended with ``status`` (``pump.py``'s ``BODY_*``): set the connection's state
        as its own decoder would have; then ``release`` as after ``wait``."""
        self._conn.taken_back(status, message)

    def release(self) -> None:
        """To the pool when the body was read to its end and the connection can carry another
        request; else the connection is closed (which stops an upstream still sending)."""
        self._conn.release()


class UpstreamConnection(asyncio.Protocol):
    """One connection: one request at a time; the reply's head is parsed here and its body decoded
    and handed to the sink inside ``data_received``."""

    def __init__(self, put_idle: Callable[[UpstreamConnection], None], read_timeout_s: float) -> None:
        self._put_idle = put_idle  # the pool's: this connection is free for another request
        self._read_timeout_s = read_timeout_s
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._phase = _IDLE
        self._method = ""
        self._got_bytes = False  # any byte of the current reply
        self._head_buf = b""
        self._head: asyncio.Future[UpstreamReply] | None = None
        self._keep_alive = False
        # The body: framing, decoder state, pieces not yet handed on, its end or failure.
        self._chunked = False
        self._left = -1  # bytes left: of a Content-Length body, or of the current chunk; -1: to close
        self._chunk_state = _SIZE
        self._chunk_buf = b""
        self._sink: Sink | None = None
        self._early: list[bytes] = []  # pieces that came before ``start_body``
        self._error: UpstreamError | None = None
        self._waiter: asyncio.Future[bool] | None = None
        self._paused = False
        self._last_rx_s = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self.reusable = False
        self.idle_since = 0.0

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._last_rx_s = time.monotonic()
        if self._phase == _BODY:
            if self._chunked and self._chunk_state == _SIZE and not self._chunk_buf:
                # The common read of a stream: exactly one whole chunk (a token or a few).
                eol = data.find(b"\r\n")
                if eol > 0 and not data[:eol].strip(_HEX):
                    size = int(data[:eol], 16)
                    if size and len(data) == eol + size + 4 and data.endswith(b"\r\n"):
                        self._give(data[eol + 2 : -2], data)
                        return
            self._body_data(data)
        elif self._phase == _HEAD:
            self._got_bytes = True
            self._head_data(data)
        else:  # bytes nobody asked for: the connection's state is unknown, so it goes
            self.reusable = False
            self.close()

    def eof_received(self) -> bool:
        return False  # close; a body that runs to the close ends in connection_lost

    def connection_lost(self, exc: Exception | None) -> None:
        self.reusable = False
        self._transport = None
        if self._phase == _HEAD:
            why = f": {exc}" if exc else ""
            if self._got_bytes:
                self._fail(UpstreamError(f"the upstream closed the connection mid-head{why}"))
            else:
                self._fail(ClosedBeforeReply(f"the upstream closed the connection before replying{why}"))
        elif self._phase == _BODY:
            if self._left == -1 and not self._chunked:
                self._end(b"")
            else:
                self._fail(UpstreamError("the upstream closed the connection mid-reply"))

    # The exchange, for the pool (upstream.py) and UpstreamReply

    async def exchange(self, method: str, head: bytes, body: bytes) -> UpstreamReply:
        if self._transport is None or self._phase != _IDLE:  # closed since it was opened or pooled
            raise ClosedBeforeReply("the upstream closed the connection before the request went out")
        self._method = method
        self._phase = _HEAD
        self._got_bytes = False
        self.reusable = False
        self._chunked = False
        self._sink, self._early, self._error, self._paused = None, [], None, False
        self._head = self._loop.create_future()
        self._last_rx_s = time.monotonic()
        self._arm_timer(self._read_timeout_s)
        self._transport.write(head + body if len(body) < 65536 else head)
        if len(body) >= 65536:
            self._transport.write(body)  # no copy of a big body just to join it
        return await self._head

    def start_body(self, sink: Sink) -> None:
        self._sink = sink
        if self._early:
            early, self._early = self._early, []
            sink(b"".join(early), None)

    async def wait_body(self) -> bool:
        if self._error is not None:
            raise self._error
        if self._phase == _DONE:
            return True
        if self._paused:
            return False
        self._waiter = self._loop.create_future()
        try:
            return await self._waiter
        finally:
            self._waiter = None

    def pause(self) -> None:
        if not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()
            self._wake(False)

    def resume(self) -> None:
        if self._paused:
            self._paused = False
            self._last_rx_s = time.monotonic()  # the silence while paused was ours
            if self._transport is not None:
                self._transport.resume_reading()

    def release(self) -> None:
        self._sink = None
        if self._phase == _DONE and self.reusable and self._transport is not None:
            self.resume()  # the body may have ended while the sink had reading paused
            self._phase = _IDLE
            self.idle_since = time.monotonic()
            self._put_idle(self)
        else:
            self.reusable = False
            self.close()

    def close(self) -> None:
        self._cancel_timer()
        if self._transport is not None:
            self._transport.close()

    def hand_over(self) -> BodyState | None:
        transport = self._transport
        if (
            self._phase != _BODY
            or self._sink is not None
            or transport is None
            or transport.get_extra_info("sslcontext") is not None
        ):
            return None
        sock = transport.get_extra_info("socket")
        if sock is None:
            return None
        self._paused = True
        transport.pause_reading()
        self._cancel_timer()  # the pump keeps the read deadline from here
        early, self._early = b"".join(self._early), []
        to_close = not self._chunked and self._left == -1
        return BodyState(
            sock.fileno(), self._chunked, to_close, self._left, self._chunk_state, self._chunk_buf, early
        )

    def taken_back(self, status: int, message: str | None) -> None:
        self._last_rx_s = time.monotonic()
        self._phase = _DONE
        if status == BODY_DONE:
            self.reusable = self._keep_alive and self._transport is not None
        else:
            self.reusable = False
            if status == BODY_BROKE:
                self._error = UpstreamError(message or "the upstream broke off mid-reply")

    # The head

    def _head_data(self, data: bytes) -> None:
        buf = self._head_buf + data if self._head_buf else data
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > MAX_HEAD_BYTES:
                self._fail(UpstreamError(f"the upstream's reply head exceeds {MAX_HEAD_BYTES} bytes"))
            else:
                self._head_buf = buf
            return
        self._head_buf = b""
        rest = buf[end + 4 :]
        try:
            reply = self._parse_head(buf[:end])
        except UpstreamError as e:
            self._fail(e)
            return
        if reply is None:  # an interim 1xx reply: the real one follows
            if rest:
                self._head_data(rest)
            return
        self._phase = _BODY
        assert self._head is not None
        self._head.set_result(reply)
        if self._left == 0 and not self._chunked:
            self._end(rest)
        elif rest:
            self._body_data(rest)

    def _parse_head(self, raw: bytes) -> UpstreamReply | None:
        head = parse_head(raw, self._method)  # upstream_head.py
        if head is None:
            return None
        self._keep_alive = head.keep_alive
        if head.chunked:
            self._chunked, self._chunk_state, self._chunk_buf = True, _SIZE, b""
        else:
            self._left = head.length
        return UpstreamReply(self, head.status, head.reason, head.headers, head.content_length)

    # The body

    def _body_data(self, data: bytes) -> None:
        if self._chunked:
            self._chunked_data(data)
            return
        left = self._left
        if left == -1 or len(data) < left:  # the common case: all of it is body, and more follows
            if left != -1:
                self._left = left - len(data)
            self._give(data)
            return
        if left:
            self._give(data[:left])
        self._left = 0
        self._end(data[left:])

    def _chunked_data(self, data: bytes) -> None:
        if self._chunk_buf:
            data = self._chunk_buf + data
            self._chunk_buf = b""
        pieces = []
        pos, n = 0, len(data)
        while pos < n:
            state = self._chunk_state
            if state == _DATA:
                take = min(self._left, n - pos)
                pieces.append(data if take == n else data[pos : pos + take])
                pos += take
                self._left -= take
                if not self._left:
                    self._chunk_state = _DATA_END
            elif state == _SIZE:
                eol = data.find(b"\r\n", pos)
                if eol < 0:
                    if n - pos > _MAX_SIZE_LINE:
                        self._fail(UpstreamError("the upstream's chunk-size line is too long"))
                        return
                    self._chunk_buf = data[pos:]
                    break
                size_text = data[pos:eol].partition(b";")[0].strip(b" \t")
                if not size_text or size_text.strip(_HEX):  # int() alone would take "+1" and "0x1"
                    self._fail(UpstreamError(f"the upstream sent a bad chunk size: {size_text[:40]!r}"))
                    return
                size = int(size_text, 16)
                pos = eol + 2
                self._left = size
                self._chunk_state = _DATA if size else _TRAILER
            elif state == _DATA_END:
                if n - pos < 2:
                    self._chunk_buf = data[pos:]
                    break
                if data[pos : pos + 2] != b"\r\n":
                    self._fail(UpstreamError("the upstream's chunk does not end where its size says"))
                    return
                pos += 2
                self._chunk_state = _SIZE
            else:  # _TRAILER: lines up to an empty one, dropped
                eol = data.find(b"\r\n", pos)
                if eol < 0:
                    if n - pos > MAX_HEAD_BYTES:
                        self._fail(UpstreamError("the upstream's chunked trailer is too long"))
                        return
                    self._chunk_buf = data[pos:]
                    break
                if eol == pos:
                    if pieces:
                        self._give(pieces[0] if len(pieces) == 1 else b"".join(pieces))
                    self._end(data[eol + 2 :])
                    return
                pos = eol + 2
        if pieces:
            self._give(pieces[0] if len(pieces) == 1 else b"".join(pieces))

    def _give(self, piece: bytes, chunk: bytes | None = None) -> None:
        sink = self._sink
        if sink is not None:
            sink(piece, chunk)
        else:
            self._early.append(piece)

    def _end(self, extra: bytes) -> None:
        """The body is complete; ``extra`` is what came after it (a well-behaved upstream sends none)."""
        self._phase = _DONE
        self._cancel_timer()
        self.reusable = self._keep_alive and not extra and self._transport is not None
        self._wake(True)

    def _fail(self, error: UpstreamError) -> None:
        phase = self._phase
        self._phase = _DONE
        self.reusable = False
        self._cancel_timer()
        self._error = error
        if self._transport is not None:
            self._transport.close()
        if phase == _HEAD and self._head is not None and not self._head.done():
            self._head.set_exception(error)
        else:
            self._wake(None)

    def _wake(self, result: bool | None) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            if self._error is not None:
                waiter.set_exception(self._error)
            else:
                waiter.set_result(bool(result))

    # The read deadline: one timer per exchange, moved on lazily rather than once per read

    def _arm_timer(self, delay_s: float) -> None:
        self._timer = self._loop.call_later(delay_s, self._on_timer)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_timer(self) -> None:
        self._timer = None
        if self._phase not in (_HEAD, _BODY):
            return
        if self._paused:
            self._arm_timer(self._read_timeout_s)
            return
        due_in = self._last_rx_s + self._read_timeout_s - time.monotonic()
        if due_in > 0:
            self._arm_timer(due_in)
        else:
            self._fail(UpstreamError(f"the upstream sent nothing for {self._read_timeout_s:g}s"))
