"""The streaming HTTP client: one keep-alive connection per session, every token timestamped.

``SessionConnection`` owns one TCP connection (geventhttpclient's HTTP parser on a gevent
socket) for the lifetime of a session and sends that session's turns over it, reconnecting
transparently when the server closed it between turns. ``stream()`` sends one
``PreparedRequest``, reads the reply line by line and returns a ``StreamResult``; it never
raises for a server failure, which comes back as an ``error_category``.

Timing (docs/metrics.md, docs/targets.md):

* ``t_send_ns``: ``perf_counter_ns()`` right before the request bytes are written.
* ``chunk_ns[i]``: arrival of the i-th token-bearing chunk: the kernel's receive timestamp
  (``SO_TIMESTAMPNS``) of the data the ``recv`` that delivered the last byte of its line returned,
  converted to the ``perf_counter_ns`` clock. The kernel stamps a segment when it arrives, so the
  time a chunk waited while this process served other streams (a batch of 100 sequences emits
  100 chunks at once) is not charged to it. Where the kernel gives no timestamp (TLS sockets,
  other systems) it is the return of that ``recv``. Either way it is taken before HTTP
  de-chunking and before JSON parsing.
  Lines are taken from the socket buffer as each ``recv`` completes them, never through
  ``iter_content``/``iter_lines`` (they wait for 1-4 KiB and smear token times by tens of ms).
  Several lines delivered by one ``recv`` share its timestamp: they did arrive together, and the
  parse time of earlier lines is not charged to later ones.
* ``t_first_ns``: ``chunk_ns[0]``, the first chunk with ``tokens > 0`` (role-only, empty and
  usage chunks do not count).
* ``t_end_ns``: end of stream (``[DONE]``, llama-server's ``stop: true``) once the rest of the
  body is drained, so the connection can carry the next turn. For failures: when the failure was
  noticed.

Deadlines: ``deadline_s`` bounds the whole request (connect, send, headers, every token and the
drain), enforced with one ``gevent.Timeout``; on expiry the result is ``timeout`` and the
connection is discarded. Two optional, tighter bounds are ``timeout`` too: ``first_byte_timeout_s``
(request sent to complete response headers: catches a server that accepts and never answers, or
trickles its headers) and ``idle_timeout_s`` (the longest silence between two reads of the body:
catches a stream that stalls). Reading an error body or draining after the end marker is bounded
by ``drain_timeout_s``.

Categories (``analysis.records.ERROR_CATEGORIES``): ``http_3xx`` (a redirect: never followed, a
load test must not wander to another address), ``http_4xx``, ``http_429``, ``http_5xx`` (the
message is the body's first line), ``timeout``, ``connection`` (nothing usable came back:
refused, reset, closed before the headers), ``client_network`` (the connect failed on the
generator's own side, before anything left: no route or link, no local address, port or file
descriptor, its name lookup; ``connect_error_category``), ``stream_cut`` (the stream ended or broke before its
end marker), ``bad_chunk`` (a line the adapter cannot parse, a line over ``max_line_bytes``, a
body in an unsupported ``Content-Encoding``). An error object inside a 2xx stream is categorised
by its ``code`` (429, other 4xx, else 5xx). ``empty_reply`` (a successful reply without a
token-bearing chunk to a request that asked for tokens) is decided where the request's
``max_tokens`` is known: ``check_reply``.

Throttling: with ``retry_after_cap_s > 0`` a 429 that carries ``Retry-After`` of at most the cap
(and less than the deadline left) is waited out and the request sent again, up to
``MAX_THROTTLE_RETRIES`` times; ``StreamResult.throttled`` counts them apart from failures. The
request keeps its first ``t_send_ns``, so its TTFT and E2E include the time the server made it
wait. A 429 without ``Retry-After``, or asking for longer than the cap, is an ``http_429`` result.

Hostile bodies: SSE as its spec allows it (``\n``, ``\r\n`` or lone ``\r`` line ends, a leading
byte order mark, comments, ``event:``/``id:`` fields, an event's data over several ``data:``
lines), chunked bodies (trailers included),
close-delimited HTTP/1.0 bodies, and gzip/deflate bodies (``Accept-Encoding: identity`` is
asked, but a server may compress anyway) are read correctly; anything else ends as a category.

Reading: on plain connections with kernel stamps (and no idle timeout) a streaming body is read
by the worker's one ``StreamReader`` (``loadgen.engine.stream_reader``) while the session's greenlet
waits, so a chunk costs no greenlet wake-up; the stamps and the parse are the same either way.

A ``SessionConnection`` is used by one greenlet at a time (one session's turns are sequential).
"""

from __future__ import annotations

import email.utils
import errno
import functools
import ipaddress
import re
import select
import socket
import ssl
import struct
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import gevent
from gevent import socket as gsocket
from geventhttpclient.response import HTTPParseError, HTTPResponse

from loadgen.engine import stream_reader
from loadgen.engine.kernel_clock import kernel_stamps_agree
from loadgen.engine.stream_reader import StreamReader
from targets.adapters.base import Adapter, BadChunk, PreparedRequest, StreamEvent, Usage

if TYPE_CHECKING:
    from loadgen.engine.health import ChunkCounts

__all__ = [
    "BAD_CHUNK",
    "CLIENT_NETWORK",
    "CONNECTION",
    "EMPTY_REPLY",
    "HTTP_3XX",
    "HTTP_4XX",
    "HTTP_5XX",
    "HTTP_429",
    "MAX_THROTTLE_RETRIES",
    "STREAM_CUT",
    "TIMEOUT",
    "BadBody",
    "ReplySeen",
    "SessionConnection",
    "StreamResult",
    "check_reply",
    "connect_error_category",
    "empty_reply_message",
    "output_tokens",
]

HTTP_3XX = "http_3xx"
HTTP_4XX = "http_4xx"
HTTP_429 = "http_429"
HTTP_5XX = "http_5xx"
TIMEOUT = "timeout"
CONNECTION = "connection"
STREAM_CUT = "stream_cut"
BAD_CHUNK = "bad_chunk"
EMPTY_REPLY = "empty_reply"
CLIENT_NETWORK = "client_network"

_perf_ns = time.perf_counter_ns
_MESSAGE_CHARS = 200
_USER_AGENT = "loadgen/0.1"
MAX_THROTTLE_RETRIES = 5
# zlib window bits: 32 + 15 reads a zlib or a gzip header, whichever the body starts with.
_INFLATE_WBITS = {"gzip": 47, "x-gzip": 47, "deflate": 47}


@dataclass(slots=True)
class StreamResult:
    """The outcome of one request; times are ``time.perf_counter_ns()`` values.

    ``chunk_ns`` and ``chunk_tokens`` are parallel lists over token-bearing chunks. ``text`` is
    the generated text (what the runtime appends to the conversation). ``usage`` and
    ``server_timings`` are the last the server reported. ``reused_connection`` says whether the
    request went over a connection kept from an earlier request. ``throttled`` counts 429
    answers waited out (``Retry-After``) before this result. ``t_send_ns`` stays 0 when nothing
    of the request left (``sent`` is False: the connect failed). ``streamed``: the reply was read
    as a stream (else as one body). ``cause``: the exception behind a failure, where one was (for
    messages such as the preflight's; never recorded). ``t_first_output_ns``: the first
    token-bearing chunk that is not reasoning (None when every one was); ``reasoning_chunk_tokens``:
    the tokens reasoning chunks carried.
    """

    t_send_ns: int = 0
    t_first_ns: int | None = None
    chunk_ns: list[int] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    t_end_ns: int | None = None
    http_status: int | None = None
    usage: Usage | None = None
    server_timings: dict | None = None
    text: str = ""
    error_category: str | None = None
    error_message: str | None = None
    retry_after_s: float | None = None
    reused_connection: bool = False
    throttled: int = 0
    streamed: bool = False
    cause: BaseException | None = None
    t_first_output_ns: int | None = None
    reasoning_chunk_tokens: int = 0

    @property
    def ok(self) -> bool:
        return self.error_category is None

    @property
    def sent(self) -> bool:
        """Whether the request was written (in part at least): False when the connect failed."""
        return self.t_send_ns != 0

    @property
    def t_last_ns(self) -> int | None:
        return self.chunk_ns[-1] if self.chunk_ns else None

    @property
    def output_tokens(self) -> int:
        """N by ``output_tokens()``'s rule, from ``usage`` and the tokens the chunks carried."""
        return output_tokens(self.usage.completion_tokens if self.usage is not None else None, self.chunk_tokens)

    @property
    def reasoning_tokens(self) -> int:
        """Reasoning tokens: ``usage``'s ``reasoning_tokens`` where the server reports it and it is
        at least the tokens the reasoning chunks carried, else those tokens; never above N."""
        counted = self.reasoning_chunk_tokens
        u = self.usage.reasoning_tokens if self.usage is not None else None
        n = u if u is not None and u >= counted else counted
        return min(n, self.output_tokens)


def output_tokens(usage_completion_tokens: int | None, chunk_tokens: list[int]) -> int:
    """N, a reply's output tokens (docs/metrics.md): ``usage.completion_tokens`` where the server
    reports it and it is at least the tokens the token-bearing chunks carried (the server's exact
    count: a chunk may carry several tokens, or tokens without text); else, where usage is absent
    or claims fewer tokens than chunks that carried them (impossible), the chunks' count."""
    counted = sum(chunk_tokens)
    if usage_completion_tokens is not None and usage_completion_tokens >= counted:
        return usage_completion_tokens
    return counted


def empty_reply_message(res: StreamResult, max_tokens: int | None) -> str | None:
    """Why ``res`` is an empty reply, or None: a successful reply with no token-bearing chunk (no
    generated text or token count) to a request that asked for at least one token. Says what
    arrived: a stream's token chunks, a body's text, and the usage the server reported."""
    if res.error_category is not None or res.chunk_tokens or not max_tokens or max_tokens < 1:
        return None
    u = res.usage.completion_tokens if res.usage is not None else None
    said = "no usage reported" if u is None else f"usage.completion_tokens {u}"
    if res.streamed:
        return f"stream ended after 0 token chunks; {said}"
    return f"reply body carried no generated text; {said}"


def check_reply(res: StreamResult, max_tokens: int | None) -> None:
    """Mark a successful ``res`` that is an empty reply (``empty_reply_message``) as failed,
    ``empty_reply``: a server that answers every request with nothing must not pass."""
    message = empty_reply_message(res, max_tokens)
    if message is not None:
        SessionConnection._fail(res, EMPTY_REPLY, message)


_NETWORK_ERRNOS = frozenset(
    getattr(errno, name)
    for name in (
        "ENETUNREACH", "EHOSTUNREACH", "ENETDOWN", "EADDRNOTAVAIL", "EADDRINUSE", "EMFILE", "ENFILE",
        "ENOBUFS", "ENOMEM",
    )
    if hasattr(errno, name)
)  # fmt: skip


def connect_error_category(e: BaseException) -> str:
    """The category of a connect that failed: ``client_network`` where the generator's own side
    failed before anything left it (no route or link, no local address or port, no file
    descriptor or buffer, its name lookup), else ``connection`` (refused, timed out, reset: the
    server's side)."""
    if isinstance(e, socket.gaierror):
        return CLIENT_NETWORK
    if isinstance(e, OSError) and not isinstance(e, ssl.SSLError) and e.errno in _NETWORK_ERRNOS:
        return CLIENT_NETWORK
    return CONNECTION


class BadBody(BadChunk):
    """The body itself cannot be read into lines (an unknown ``Content-Encoding``, data that does
    not decompress, a line over ``max_line_bytes``): ``bad_chunk``, but no adapter's doing."""


class _FirstByteTimeout(Exception):
    """The response headers did not arrive within the first-byte timeout."""


class _ClosedBeforeResponse(Exception):
    """The peer closed the connection before a complete status line and headers."""

    def __init__(self, received: int) -> None:
        super().__init__("connection closed before the response headers")
        self.received = received


_HEAD_KEPT = 256  # bytes of a response's start kept to say what came (the preflight's messages)
_BOM = b"\xef\xbb\xbf"  # UTF-8 byte order mark, dropped at the start of a stream (SSE spec)
_ANY_EOL = re.compile(rb"\r\n|\r|\n")

_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux; SCM_TIMESTAMPNS has the same value
_ANC_SIZE = socket.CMSG_SPACE(16)  # one struct timespec
_unpack_timespec = struct.Struct("qq").unpack_from


def enable_kernel_timestamps(sock: socket.socket) -> bool:
    """Ask the kernel to stamp received data (``SO_TIMESTAMPNS``); False where it can't."""
    if not hasattr(sock, "recvmsg") or not kernel_stamps_agree():
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


def _arrival_ns(anc: list) -> int:
    """The kernel's receive stamp in ``recvmsg``'s ancillary data, on the perf_counter clock; now
    where there is none (or it is later than now)."""
    now = _perf_ns()
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(payload) >= 16:
            sec, nsec = _unpack_timespec(payload)
            # CLOCK_REALTIME -> perf_counter: the offset is read now, so clock slews cost
            # only ppm of the (sub-second) time the data waited.
            stamped = sec * 1_000_000_000 + nsec - (time.time_ns() - _perf_ns())
            if stamped <= now:
                return stamped
    return now


class _StreamState:
    """What a streamed reply has said so far, fed its lines as they come.

    One ``data:`` line is one event's JSON nearly always, and is parsed as it comes. SSE also lets
    an event's data run over several ``data:`` lines (joined with LF; the event ends at a blank
    line): when a ``data:`` line does not parse on its own, it and the next ``data:`` lines are
    kept until the blank line, then parsed as one ``data:`` line, stamped with the arrival of the
    last of them. So the common case costs nothing more, and a line that is simply broken still
    fails, at the end of its event.
    """

    __slots__ = (
        "chunk_ns", "chunk_tokens", "counts", "done", "error", "output_ns", "parse", "parts", "pending",
        "pending_ns", "reasoning", "timings", "usage",
    )  # fmt: skip

    def __init__(
        self, parse: Callable[[bytes], StreamEvent | None], res: StreamResult, counts: ChunkCounts | None = None
    ) -> None:
        self.parse = parse
        self.counts = counts  # loadgen.engine.health.ChunkCounts: token chunks, and those sharing a recv
        self.chunk_ns = res.chunk_ns
        self.chunk_tokens = res.chunk_tokens
        self.parts: list[str] = []
        self.usage: Usage | None = None
        self.timings: dict | None = None
        self.error: StreamEvent | None = None
        self.done = False
        self.pending: list[bytes] | None = None  # the data of an event over several data: lines
        self.pending_ns = 0
        self.output_ns: int | None = None  # the first token-bearing chunk that is not reasoning
        self.reasoning = 0  # tokens the reasoning chunks carried

    def take(self, lines: list[bytes], t_recv_ns: int) -> bool:
        """Parse ``lines`` (all received at ``t_recv_ns``); True once the stream has said its last
        (its end marker, or an error)."""
        if self.pending is not None:
            return self._take_pending(iter(lines), t_recv_ns)
        parse = self.parse
        counts = self.counts
        it = iter(lines)  # on a data: line that does not parse, the rest goes to _take_pending
        for line in it:
            if not line or line == b"\r":
                continue
            try:
                ev = parse(line)
            except BadChunk:
                if not line.startswith(b"data:"):
                    raise
                self.pending = [_data_value(line)]
                self.pending_ns = t_recv_ns
                return self._take_pending(it, t_recv_ns)
            if ev is None:
                continue
            # What follows is _apply, written out: a method call per chunk costs ~0.1 µs of a
            # per-chunk budget of ~20 µs (docs/performance.md). Change both together.
            if ev.tokens:
                chunk_ns = self.chunk_ns
                if counts is not None:
                    counts.token_chunks += 1
                    if chunk_ns and chunk_ns[-1] == t_recv_ns:  # one recv, one stamp: the gap is lost
                        counts.coalesced += 1
                chunk_ns.append(t_recv_ns)
                self.chunk_tokens.append(ev.tokens)
                if ev.reasoning:
                    self.reasoning += ev.tokens
                elif self.output_ns is None:
                    self.output_ns = t_recv_ns
            if ev.text:
                self.parts.append(ev.text)
            if ev.usage is not None:
                self.usage = ev.usage
            if ev.server_timings is not None:
                self.timings = ev.server_timings
            if ev.error is not None:
                self.error = ev
                return True
            if ev.done:
                self.done = True
                return True
        return False

    def _take_pending(self, it: Iterator[bytes], t_recv_ns: int) -> bool:
        """``take`` while an event's data runs over several ``data:`` lines: they are kept to its
        blank line, then the event is parsed whole and the lines after it go the usual way."""
        pending = self.pending
        for line in it:
            if not line or line == b"\r":
                if self.dispatch():
                    return True
                return self.take(list(it), t_recv_ns)
            if line.startswith(b"data:"):
                pending.append(_data_value(line))  # type: ignore[union-attr]
                self.pending_ns = t_recv_ns
                continue
            ev = self.parse(line)  # a comment or an event:/id: field inside the event: nothing
            if ev is not None and self._apply(ev, t_recv_ns):
                return True
        return False

    def dispatch(self) -> bool:
        """The event kept over several ``data:`` lines, parsed as one; True when it was the last.
        Raises what the adapter raises when the joined data does not parse either."""
        data, self.pending = self.pending, None
        if data is None:
            return False
        ev = self.parse(b"data:" + b"\n".join(data))
        return ev is not None and self._apply(ev, self.pending_ns)

    def _apply(self, ev: StreamEvent, t_recv_ns: int) -> bool:
        """``take``'s handling of one event, off its fast path; True when it was the last."""
        if ev.tokens:
            if self.counts is not None:
                self.counts.token_chunks += 1
                if self.chunk_ns and self.chunk_ns[-1] == t_recv_ns:
                    self.counts.coalesced += 1
            self.chunk_ns.append(t_recv_ns)
            self.chunk_tokens.append(ev.tokens)
            if ev.reasoning:
                self.reasoning += ev.tokens
            elif self.output_ns is None:
                self.output_ns = t_recv_ns
        if ev.text:
            self.parts.append(ev.text)
        if ev.usage is not None:
            self.usage = ev.usage
        if ev.server_timings is not None:
            self.timings = ev.server_timings
        if ev.error is not None:
            self.error = ev
            return True
        if ev.done:
            self.done = True
            return True
        return False


def _data_value(line: bytes) -> bytes:
    """The value of a ``data:`` line: after the colon, less one leading space and the CR of a CRLF."""
    value = line[5:]
    if value.endswith(b"\r"):
        value = value[:-1]
    return value[1:] if value.startswith(b" ") else value


class _Response(HTTPResponse):
    """geventhttpclient's C HTTP/1.1 parser (chunked and close-delimited bodies) over our socket,
    with a line reader that remembers when the bytes of the returned line arrived."""

    def __init__(
        self,
        sock: socket.socket,
        block_size: int,
        kernel_timestamps: bool = False,
        max_line_bytes: int = 8 << 20,
    ) -> None:
        super().__init__("POST")
        self.sock = sock
        self.block_size = block_size
        self.max_line_bytes = max_line_bytes
        self.t_recv_ns = 0
        self.received = 0
        self._scan_from = 0  # bytes of the buffer already searched for a newline
        self._inflate = None  # a decompressor's decompress() when the body is compressed
        self._undecodable: str | None = None
        self.ended_mid_line = False  # the body ended with a line that has no newline
        self.head_bytes = b""  # the first bytes that came, up to _HEAD_KEPT (what the server said)
        self._at_start = True  # no body line returned yet (a leading byte order mark is dropped)
        self._any_eol = False  # a lone CR was seen: lines end at CR, LF or CRLF from now on
        self._recv = self._recv_kernel_stamped if kernel_timestamps else self._recv_plain

    def _recv_plain(self) -> bytes:
        data = self.sock.recv(self.block_size)
        self.t_recv_ns = _perf_ns()
        return data

    def _recv_kernel_stamped(self) -> bytes:
        data, anc, _flags, _addr = self.sock.recvmsg(self.block_size, _ANC_SIZE)
        self.t_recv_ns = _arrival_ns(anc)
        return data

    def read_headers(self) -> None:
        while not self.headers_complete or self.get_code() < 200:
            data = self._recv()
            if not data:
                raise _ClosedBeforeResponse(self.received)
            if self.received < _HEAD_KEPT:
                self.head_bytes += data[: _HEAD_KEPT - self.received]
            self.received += len(data)
            self.feed(data)

    def _on_headers_complete(self) -> int | bool | None:
        skip = super()._on_headers_complete()
        # Called by the parser before any body bytes, so every body byte goes through _on_body.
        encoding = self.get("content-encoding")
        if encoding:
            name = encoding.strip().lower() if isinstance(encoding, str) else ",".join(encoding)
            if name in _INFLATE_WBITS:
                self._inflate = zlib.decompressobj(_INFLATE_WBITS[name]).decompress
            elif name != "identity":
                self._undecodable = f"body in Content-Encoding {name!r}, which loadgen cannot decode"
        return skip

    def _on_body(self, buf: bytearray) -> None:
        if self._inflate is None:
            self._body_buffer += buf
            return
        try:
            self._body_buffer += self._inflate(buf)
        except zlib.error as e:
            self._inflate = None
            self._undecodable = f"body does not decompress as its Content-Encoding says ({e})"

    def _fill(self) -> None:
        self.feed_body(self._recv())

    def feed_body(self, data: bytes) -> None:
        """Parse ``data`` read from the socket into the body buffer."""
        # b"" (peer closed) completes a close-delimited body, or raises HTTPParseError mid-message.
        self.feed(data)
        if self._undecodable is not None:
            raise BadBody(self._undecodable)
        if not data and not self.message_complete:
            raise HTTPParseError("connection closed mid-body")

    def read_lines(self) -> list[bytes]:
        """Every complete body line now buffered (without their line end), reading once when there
        is none; [] once the body is complete.

        All lines returned by one call ended in the same ``recv`` (a fill happens only when no
        line is complete), so ``t_recv_ns`` holds for each of them. One split per ``recv``
        instead of one search, copy and delete per line: at hundreds of
        streams a ``recv`` often holds several events. Blank lines come back as b"" (or b"\\r").

        Line ends are those of SSE: LF, CRLF, or a lone CR. LF and CRLF take one ``split`` on LF
        (a CRLF line keeps its CR, which JSON and the blank-line test ignore); only once a CR is
        seen that no LF follows does the body switch to splitting at every kind of line end
        (``_take_lines_any``), so the common streams pay one ``in`` test per ``recv`` for it. A
        UTF-8 byte order mark at the start of the body is dropped, as the SSE spec says.
        """
        while (lines := self.take_lines()) is None:
            self._fill()
        return lines

    def take_lines(self) -> list[bytes] | None:
        """``read_lines`` without reading: the complete lines buffered now, [] once the body is
        complete, None when more data is needed. A line longer than ``max_line_bytes`` is
        ``BadChunk``: a server that never sends a newline must not grow the buffer without bound."""
        if self._any_eol:
            return self._take_lines_any()
        buf = self._body_buffer
        i = buf.rfind(b"\n", self._scan_from)
        if i >= 0:
            block = bytes(buf[:i])
            # A CR in the block is a CRLF's (the usual case), unless some CR has no LF after it.
            cr = block.count(b"\r")
            if cr and cr != block.count(b"\r\n") + (block[-1] == 13):
                self._any_eol = True
                return self._take_lines_any()
            del buf[: i + 1]
            self._scan_from = 0
            lines = block.split(b"\n")
            if self._at_start:
                self._at_start = False
                if lines[0].startswith(_BOM):
                    lines[0] = lines[0][3:]
            return lines
        # No LF: a CR with a byte after it (or at the body's end) ends a line of its own.
        j = buf.find(b"\r", max(0, self._scan_from - 1))
        if j >= 0 and (j + 1 < len(buf) or self.message_complete):
            self._any_eol = True
            return self._take_lines_any()
        if self.message_complete:
            if self._undecodable is not None:
                raise BadBody(self._undecodable)
            if buf:
                line = bytes(buf)
                buf.clear()
                self.ended_mid_line = True
                if self._at_start:
                    self._at_start = False
                    line = line.removeprefix(_BOM)
                return [line]
            return []
        n = len(buf)
        if n > self.max_line_bytes:
            raise BadBody(f"a stream line longer than {self.max_line_bytes} bytes")
        self._scan_from = n
        return None

    def _take_lines_any(self) -> list[bytes] | None:
        """``take_lines`` for a body whose lines end at CR, LF or CRLF (one seen lone CR says so)."""
        buf = self._body_buffer
        n = len(buf)
        i = max(buf.rfind(b"\n"), buf.rfind(b"\r"))
        if i >= 0 and i == n - 1 and buf[i] == 13 and not self.message_complete:
            # A CR as the last byte so far may be half of a CRLF: it ends its line once the
            # next byte is known (else CR LF would read as two line ends, an extra blank line).
            i = max(buf.rfind(b"\n", 0, i), buf.rfind(b"\r", 0, i))
        if i >= 0:
            block = bytes(buf[: i + 1])
            del buf[: i + 1]
            lines = _ANY_EOL.split(block)
            lines.pop()  # what follows the last line end: nothing
            if self._at_start:
                self._at_start = False
                if lines[0].startswith(_BOM):
                    lines[0] = lines[0][3:]
            return lines
        if self.message_complete:
            if self._undecodable is not None:
                raise BadBody(self._undecodable)
            if buf:
                line = bytes(buf)
                buf.clear()
                self.ended_mid_line = True
                if self._at_start:
                    self._at_start = False
                    line = line.removeprefix(_BOM)
                return [line]
            return []
        if n > self.max_line_bytes:
            raise BadBody(f"a stream line longer than {self.max_line_bytes} bytes")
        return None

    def read_body(self, limit: int) -> bytes:
        """The rest of the body, up to about ``limit`` bytes."""
        buf = self._body_buffer
        while not self.message_complete and len(buf) <= limit:
            self._fill()
        if self._undecodable is not None:
            raise BadBody(self._undecodable)
        out = bytes(buf[:limit])
        buf.clear()
        self._scan_from = 0
        return out

    def keep_alive(self) -> bool:
        return self.message_complete and not self.parser_failed() and self.should_keep_alive()


@dataclass(slots=True)
class ReplySeen:
    """What came of a reply, for messages that say so (``SessionConnection.seen()``).

    ``head_complete``: the status line and headers were read; ``status``, ``reason`` and
    ``headers`` (lower-case names; repeated ones joined with ", ") then say what they were.
    ``received``: bytes that came before the headers were complete, and ``first_bytes`` the
    first of them. ``pending``: body bytes that came and make no complete line yet.
    """

    head_complete: bool
    status: int | None
    reason: str
    headers: dict[str, str]
    received: int
    first_bytes: bytes
    pending: bytes


class SessionConnection:
    """One keep-alive HTTP/1.1 connection to ``base_url`` for one session.

    ``base_url`` may carry a path prefix (``http://host:8000/prefix``); adapter paths are
    appended to it. ``connect_timeout_s`` bounds each TCP connect (within the request deadline).
    ``api_key`` is sent as the adapter's auth header (``Authorization: Bearer`` for the built-in
    ones). ``extra_headers`` go on every request (a request's own headers win over them).
    ``drain_timeout_s`` bounds reading the end of a body after its end marker (past it the
    result stands and the connection is dropped) and reading an error body.
    ``first_byte_timeout_s``, ``idle_timeout_s`` and ``retry_after_cap_s``: see the module
    docstring (None or 0: off). ``ssl_context`` verifies ``https://`` targets (default: the
    system's trust store; see ``targets.tls``). ``recv_delays``: a list to which every ``recv``
    of a stream appends its receive delay (ns from the data's arrival stamp to its parsing; the
    generator's health, ``loadgen.engine.health``). ``connections_opened`` counts TCP connects.
    """

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout_s: float = 5.0,
        api_key: str | None = None,
        extra_headers: dict[str, str] | None = None,
        block_size: int = 65536,
        drain_timeout_s: float = 2.0,
        max_error_body_bytes: int = 65536,
        first_byte_timeout_s: float | None = None,
        idle_timeout_s: float | None = None,
        retry_after_cap_s: float = 0.0,
        max_line_bytes: int = 8 << 20,
        ssl_context: ssl.SSLContext | None = None,
        recv_delays: list[int] | None = None,
    ) -> None:
        u = urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"target URL must be http(s)://host[:port][/prefix], not {base_url!r}")
        self.base_url = base_url
        self._tls = u.scheme == "https"
        self._host = u.hostname
        self._port = u.port or (443 if self._tls else 80)
        host = f"[{self._host}]" if ":" in self._host else self._host
        default_port = 443 if self._tls else 80
        self._host_header = host if self._port == default_port else f"{host}:{self._port}"
        self._prefix = u.path.rstrip("/")
        self._connect_timeout_s = connect_timeout_s
        self._api_key = api_key
        self._extra_headers = dict(extra_headers or {})
        self._block_size = block_size
        self._drain_timeout_s = drain_timeout_s
        self._max_error_body = max_error_body_bytes
        self._first_byte_timeout_s = first_byte_timeout_s or None
        self._idle_timeout_s = idle_timeout_s or None
        self._retry_after_cap_s = retry_after_cap_s
        self._max_line_bytes = max_line_bytes
        self._ssl_context = ssl_context
        self._recv_delays = recv_delays
        self._sock: socket.socket | None = None
        self._kernel_ts = False
        self._reader: StreamReader | None = None
        self._phase = "idle"
        self.connections_opened = 0
        self.current: StreamResult | None = None  # the request under way, or the last one
        # The reply under way, or the last one (what came of it: ``seen()``).
        self.last_response: _Response | None = None

    # ---- lifecycle -----------------------------------------------------------------------------

    def preconnect(self) -> None:
        """Open the connection now, ahead of the first request (a failure is left for ``stream``).

        A pooled HTTP client rarely pays a connect for a new conversation; opening it before the
        first turn's intended time keeps the server's accept queue out of that turn's TTFT, as
        it is out of every later turn's.
        """
        try:
            self._ensure_connected()
        except OSError:
            self.close()

    def seen(self) -> ReplySeen | None:
        """What came of the last request's reply (None when nothing was sent): not on the hot
        path, read after a result to say what the server did."""
        resp = self.last_response
        if resp is None:
            return None
        complete = resp.headers_complete
        headers: dict[str, str] = {}
        if complete:
            for k, v in resp.items():
                k = k.lower()
                headers[k] = f"{headers[k]}, {v}" if k in headers else v
        return ReplySeen(
            head_complete=complete,
            status=resp.get_code() if complete else None,
            reason=resp.status_message or "",
            headers=headers,
            received=resp.received,
            first_bytes=resp.head_bytes,
            pending=bytes(resp._body_buffer[:_HEAD_KEPT]),
        )

    def close(self) -> None:
        """Close the connection (the next request opens a new one)."""
        sock, self._sock = self._sock, None
        self._reader = None
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass

    def __enter__(self) -> SessionConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the request ---------------------------------------------------------------------------

    def stream(self, prepared: PreparedRequest, adapter: Adapter, *, deadline_s: float) -> StreamResult:
        """Send ``prepared``, read the whole reply with ``adapter`` within ``deadline_s`` seconds.

        Streaming requests (``prepared.stream``) are parsed line by line with
        ``adapter.new_stream()``; others as one body with ``adapter.parse_response``. Server
        failures are returned as ``error_category``; only programming errors raise.
        """
        # Kept where a stop that kills this request mid-way finds what arrived (loadgen.engine.session).
        res = self.current = StreamResult()
        timer = gevent.Timeout(deadline_s)
        timer.start()
        t_deadline_ns = _perf_ns() + int(deadline_s * 1e9)
        try:
            self._exchange(prepared, adapter, res)
            while (wait_s := self._throttle_wait_s(res, t_deadline_ns)) is not None:
                self._phase = f"waiting {wait_s:g} s as the server's Retry-After asked"
                gevent.sleep(wait_s)
                # The request keeps its first send time: the wait the server imposed is latency.
                res = self.current = StreamResult(t_send_ns=res.t_send_ns, throttled=res.throttled + 1)
                self._exchange(prepared, adapter, res)
        except gevent.Timeout as t:
            if t is not timer:
                raise
            self.close()
            got = f" ({len(res.chunk_ns)} token chunks received)" if res.chunk_ns else ""
            self._fail(res, TIMEOUT, f"deadline of {deadline_s:g} s passed while {self._phase}{got}")
        except BaseException:
            self.close()  # killed mid-request: the connection state is unknown
            raise
        finally:
            timer.close()
            self._phase = "idle"
        if res.t_end_ns is None:
            res.t_end_ns = _perf_ns()
        return res

    def _throttle_wait_s(self, res: StreamResult, t_deadline_ns: int) -> float | None:
        """How long to wait before sending a throttled request again; None: the result stands."""
        if res.error_category != HTTP_429 or self._retry_after_cap_s <= 0:
            return None
        wait_s = res.retry_after_s
        why = None
        if wait_s is None:
            why = "no Retry-After"
        elif wait_s > self._retry_after_cap_s:
            why = f"Retry-After {wait_s:g} s is over the {self._retry_after_cap_s:g} s cap"
        elif res.throttled >= MAX_THROTTLE_RETRIES:
            why = f"still throttled after {res.throttled} retries"
        elif _perf_ns() + int(wait_s * 1e9) >= t_deadline_ns:
            why = f"Retry-After {wait_s:g} s is past the request deadline"
        if why is None:
            return wait_s
        self._fail(res, HTTP_429, f"{res.error_message} ({why})")
        return None

    def _exchange(self, prepared: PreparedRequest, adapter: Adapter, res: StreamResult) -> None:
        payload = self._encode(prepared, adapter)
        t_first_send_ns = res.t_send_ns
        for attempt in (0, 1):
            self._phase = "connecting"
            try:
                fresh = self._ensure_connected()
            except OSError as e:
                # Nothing of this try left: a first send keeps no send time (t_send_ns 0).
                res.t_send_ns = t_first_send_ns
                res.cause = e
                self._fail(
                    res, connect_error_category(e), f"cannot connect to {self._host}:{self._port}: {_reason(e)}"
                )
                return
            sock = self._sock
            res.reused_connection = not fresh
            self._phase = "sending the request"
            resp = self.last_response = _Response(sock, self._block_size, self._kernel_ts, self._max_line_bytes)
            res.t_send_ns = t_first_send_ns or _perf_ns()
            try:
                if self._idle_timeout_s is not None:
                    sock.settimeout(None)  # the first-byte timeout, not the idle one, bounds headers
                sock.sendall(payload)
                self._phase = "waiting for the response headers"
                self._read_headers(resp)
            except _FirstByteTimeout:
                self.close()
                self._fail(
                    res,
                    TIMEOUT,
                    f"no complete response headers within {self._first_byte_timeout_s:g} s of sending "
                    f"the request (first-byte timeout; {resp.received} bytes came)",
                )
                return
            except (OSError, HTTPParseError, _ClosedBeforeResponse) as e:
                self.close()
                # A kept connection the server closed while idle: nothing was processed, so the
                # request goes once more over a new connection (as browsers and urllib3 do).
                if not fresh and attempt == 0 and resp.received == 0 and _is_close(e):
                    continue
                res.cause = e
                self._fail(res, CONNECTION, _describe(e))
                return
            break
        status = res.http_status = resp.get_code()
        if self._idle_timeout_s is not None:
            sock.settimeout(self._idle_timeout_s)
        if not 200 <= status < 300:
            self._http_error(resp, res, status)
        elif prepared.stream:
            self._read_stream(resp, adapter, res)
        else:
            self._read_whole(resp, adapter, res)

    def _read_headers(self, resp: _Response) -> None:
        if self._first_byte_timeout_s is None:
            resp.read_headers()
            return
        timer = gevent.Timeout(self._first_byte_timeout_s, _FirstByteTimeout())
        timer.start()
        try:
            resp.read_headers()
        finally:
            timer.close()

    def _read_stream(self, resp: _Response, adapter: Adapter, res: StreamResult) -> None:
        st = _StreamState(adapter.new_stream().parse_line, res, getattr(self._recv_delays, "chunks", None))
        chunk_ns = res.chunk_ns
        res.streamed = True
        self._phase = "streaming"
        try:
            if self._reader is not None:
                self._follow(resp, st, self._reader)
            else:
                read_lines = resp.read_lines
                delays = self._recv_delays
                while True:
                    lines = read_lines()
                    if not lines:
                        st.dispatch()
                        break
                    t_recv_ns = resp.t_recv_ns
                    if delays is not None:
                        delays.append(_perf_ns() - t_recv_ns)
                    if st.take(lines, t_recv_ns):
                        break
        except BadChunk as e:
            self.close()
            res.cause = e
            if resp.ended_mid_line:
                # A close-delimited body cut mid-line: the line is a fragment, not a bad chunk.
                self._fail(res, STREAM_CUT, f"stream ended mid-line after {len(chunk_ns)} token chunks")
            else:
                self._fail(res, BAD_CHUNK, str(e))
            return
        except TimeoutError:
            self.close()
            self._fail(res, TIMEOUT, self._idle_message(len(chunk_ns)))
            return
        except (OSError, HTTPParseError) as e:
            self.close()
            self._fail(res, STREAM_CUT, f"stream broke after {len(chunk_ns)} token chunks: {_describe(e)}")
            return
        except Exception as e:
            # A third-party adapter that trips over a line must not kill the session's greenlet.
            self.close()
            self._fail(res, BAD_CHUNK, f"adapter {adapter.name!r} failed on a line: {type(e).__name__}: {e}")
            return
        finally:
            res.text = "".join(st.parts)
            res.usage = st.usage
            res.server_timings = st.timings
            res.t_first_output_ns = st.output_ns
            res.reasoning_chunk_tokens = st.reasoning
            if chunk_ns:
                res.t_first_ns = chunk_ns[0]
        error = st.error
        if error is not None:
            category = HTTP_429 if error.error_code == 429 else HTTP_4XX
            if error.error_code is None or not 400 <= error.error_code < 500:
                category = HTTP_5XX
            self._fail(res, category, f"error in stream: {error.error}")
            self._drain(resp)
            return
        if not st.done:
            self._fail(
                res, STREAM_CUT, f"stream ended without its end marker after {len(chunk_ns)} token chunks"
            )
            self._release(resp)
            return
        t_done = _perf_ns()
        res.t_end_ns = _perf_ns() if self._drain(resp) else t_done

    def _follow(self, resp: _Response, st: _StreamState, reader: StreamReader) -> None:
        """The body's lines through the worker's ``StreamReader`` (``loadgen.engine.stream_reader``):
        what came with the head first, then every read in the reader's greenlet."""
        delays = self._recv_delays
        while (lines := resp.take_lines()) is not None:
            if not lines:
                st.dispatch()
                return
            if delays is not None:
                delays.append(_perf_ns() - resp.t_recv_ns)
            if st.take(lines, resp.t_recv_ns):
                return
        take_lines = resp.take_lines
        take = st.take
        feed_body = resp.feed_body

        def consume(data: bytes, anc: list) -> bool:
            t_recv_ns = resp.t_recv_ns = _arrival_ns(anc)
            if delays is not None:
                delays.append(_perf_ns() - t_recv_ns)
            feed_body(data)
            while (lines := take_lines()) is not None:
                if not lines:
                    st.dispatch()
                    return True
                if take(lines, t_recv_ns):
                    return True
            return False

        reader.follow(self._sock, self._block_size, consume)

    def _read_whole(self, resp: _Response, adapter: Adapter, res: StreamResult) -> None:
        self._phase = "reading the response body"
        try:
            body = resp.read_body(1 << 30)
        except BadChunk as e:
            self.close()
            self._fail(res, BAD_CHUNK, str(e))
            return
        except TimeoutError:
            self.close()
            self._fail(res, TIMEOUT, self._idle_message(0))
            return
        except (OSError, HTTPParseError) as e:
            self.close()
            self._fail(res, STREAM_CUT, f"body broke: {_describe(e)}")
            return
        res.t_end_ns = resp.t_recv_ns
        self._release(resp)
        try:
            ev = adapter.parse_response(body)
        except BadChunk as e:
            self._fail(res, BAD_CHUNK, str(e))
            return
        except Exception as e:
            self._fail(res, BAD_CHUNK, f"adapter {adapter.name!r} failed on the body: {type(e).__name__}: {e}")
            return
        res.text, res.usage, res.server_timings = ev.text, ev.usage, ev.server_timings
        if ev.error is not None:
            code = ev.error_code
            category = HTTP_429 if code == 429 else HTTP_4XX if code and 400 <= code < 500 else HTTP_5XX
            self._fail(res, category, f"error in body: {ev.error}")
            return
        if ev.tokens or ev.text:
            res.chunk_ns.append(resp.t_recv_ns)
            res.chunk_tokens.append(ev.tokens or 1)
            res.t_first_ns = resp.t_recv_ns
            if ev.text or not ev.reasoning:  # one body: its answer arrived with it
                res.t_first_output_ns = resp.t_recv_ns

    def _idle_message(self, chunks: int) -> str:
        return f"no data for {self._idle_timeout_s:g} s after {chunks} token chunks (idle timeout)"

    def _http_error(self, resp: _Response, res: StreamResult, status: int) -> None:
        category = HTTP_429 if status == 429 else HTTP_5XX if status >= 500 else HTTP_4XX
        res.retry_after_s = _retry_after(resp.get("retry-after"))
        if status < 400:
            location = resp.get("location")
            location = location[0] if isinstance(location, list) else location
            self._fail(res, HTTP_3XX, f"HTTP {status}: redirect to {location or '?'}, not followed")
            self.close()
            return
        self._phase = "reading the error body"
        # The whole deadline is no bound here: a server that sends an error status and then
        # trickles or withholds the body must not hold the session for minutes.
        timer = gevent.Timeout(self._drain_timeout_s)
        timer.start()
        complete = False
        try:
            body = resp.read_body(self._max_error_body)
            complete = True
        except gevent.Timeout as t:
            if t is not timer:
                raise
            body = bytes(resp._body_buffer[: self._max_error_body])
        except (OSError, HTTPParseError, BadChunk):
            body = b""
        finally:
            timer.close()
        first = _first_line(body) or (resp.status_message or "")
        self._fail(res, category, f"HTTP {status}: {first}".rstrip(": "))
        if complete:
            self._release(resp)
        else:
            self.close()

    # ---- connection management -----------------------------------------------------------------

    def _ensure_connected(self) -> bool:
        """Connect unless a healthy idle connection is kept; True when a new one was opened."""
        sock = self._sock
        if sock is not None:
            try:
                readable, _, _ = select.select([sock], [], [], 0)
            except (OSError, ValueError):
                readable = [sock]
            if not readable or (self._tls and _only_tls_records(sock)):
                return False
            # An idle connection has nothing to read: readable means the server closed it (EOF)
            # or sent something unsolicited. Either way it cannot carry the next request.
            self.close()
        sock = _connect(self._host, self._port, self._connect_timeout_s)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls:
                if self._ssl_context is None:
                    import gevent.ssl

                    self._ssl_context = gevent.ssl.create_default_context()
                sock = _wrap_tls(self._ssl_context, sock, self._host)
            sock.settimeout(None)  # the request deadline (gevent.Timeout) bounds every wait
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self._kernel_ts = not self._tls and enable_kernel_timestamps(sock)
        # An idle timeout is the gevent socket's own timeout: such streams read in their greenlet.
        if self._kernel_ts and stream_reader.AVAILABLE and self._idle_timeout_s is None:
            self._reader = stream_reader.stream_reader()
        self.connections_opened += 1
        return True

    def _release(self, resp: _Response) -> None:
        """Keep the connection for the next request if the reply ended cleanly and allows it."""
        if not resp.keep_alive():
            self.close()

    def _drain(self, resp: _Response) -> bool:
        """Read the rest of the body after the end marker; False (connection dropped) if it fails."""
        self._phase = "draining the body"
        timer = gevent.Timeout(self._drain_timeout_s)
        timer.start()
        try:
            while resp.read_lines():
                pass
        except gevent.Timeout as t:
            if t is not timer:
                raise
            self.close()
            return False
        except (OSError, HTTPParseError):
            self.close()
            return False
        finally:
            timer.close()
        self._release(resp)
        return True

    def _encode(self, prepared: PreparedRequest, adapter: Adapter) -> bytes:
        headers = (
            {**self._extra_headers, **prepared.headers} if self._extra_headers else dict(prepared.headers)
        )
        if self._api_key:
            headers.update(adapter.auth_headers(self._api_key))
        lines = [
            f"{prepared.method} {self._prefix}{prepared.path} HTTP/1.1",
            f"Host: {self._host_header}",
            f"Content-Length: {len(prepared.body)}",
            f"User-Agent: {_USER_AGENT}",
            "Accept-Encoding: identity",
        ]
        for k, v in headers.items():
            v = str(v)
            if "\r" in v or "\n" in v or "\r" in k or "\n" in k or ":" in k:
                raise ValueError(f"header {k!r} has a character HTTP forbids: {v!r}")
            lines.append(f"{k}: {v}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + prepared.body

    @staticmethod
    def _fail(res: StreamResult, category: str, message: str) -> None:
        res.error_category = category
        one_line = " ".join(message.split())
        res.error_message = (
            one_line if len(one_line) <= _MESSAGE_CHARS else one_line[: _MESSAGE_CHARS - 3] + "..."
        )


def _only_tls_records(sock: ssl.SSLSocket) -> bool:
    """Whether what made an idle TLS connection readable was TLS's own (a TLS 1.3 server sends its
    session tickets after the handshake): then it is still good for the next request. Reading
    without blocking lets the TLS layer take them; application data or EOF means it is not."""
    try:
        sock.settimeout(0.0)
        try:
            sock.recv(1)
        finally:
            sock.settimeout(None)
    except (ssl.SSLWantReadError, BlockingIOError):
        return True
    except (OSError, ValueError):
        return False
    return False  # EOF (b""), or a byte of a reply nobody asked for


@functools.lru_cache(maxsize=64)
def _literal_family(host: str) -> int | None:
    """The address family of an IP literal; None for a name (parsed once per host, not per connect)."""
    try:
        return socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        return None


def _connect(host: str, port: int, timeout_s: float) -> socket.socket:
    """A TCP connection; an IP literal is connected directly, without a name lookup.

    gevent resolves names in a thread pool, even ``127.0.0.1``: with many sessions starting at
    once on a busy machine that queue alone made first requests leave milliseconds late.
    """
    family = _literal_family(host)
    if family is None:
        return gsocket.create_connection((host, port), timeout=timeout_s)
    sock = gsocket.socket(family, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout_s)
        sock.connect((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


def _wrap_tls(ctx: ssl.SSLContext, sock: socket.socket, host: str) -> socket.socket:
    """``sock`` wrapped in TLS as a cooperative gevent ``SSLSocket``, whether ``ctx`` comes from
    ``gevent.ssl`` or from the standard ``ssl`` module (as the preflight's callers make them):
    a standard context would wrap into a blocking socket that no deadline can interrupt."""
    import gevent.ssl

    if isinstance(ctx, gevent.ssl.SSLContext):
        return ctx.wrap_socket(sock, server_hostname=host)
    return gevent.ssl.SSLSocket(sock=sock, server_hostname=host, _context=ctx)


def _is_close(e: BaseException) -> bool:
    return isinstance(
        e, _ClosedBeforeResponse | ConnectionResetError | BrokenPipeError | ConnectionAbortedError
    )


def _reason(e: BaseException) -> str:
    if isinstance(e, ConnectionRefusedError):
        return "connection refused"
    if isinstance(e, TimeoutError | socket.timeout):
        return "connect timed out"
    if isinstance(e, socket.gaierror):
        return f"cannot resolve host ({e.strerror})"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror.lower()
    return str(e) or type(e).__name__


def _describe(e: BaseException) -> str:
    if isinstance(e, _ClosedBeforeResponse):
        return "server closed the connection before answering"
    if isinstance(e, HTTPParseError):
        return f"bad or truncated HTTP response ({e})"
    return _reason(e)


def _first_line(body: bytes) -> str:
    for line in body.decode("utf-8", "replace").splitlines():
        if line.strip():
            return line.strip()
    return ""


def _retry_after(value: str | list | None) -> float | None:
    """``Retry-After`` in seconds: a number of seconds or an HTTP date."""
    if isinstance(value, list):
        value = value[0] if value else None
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())
