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

The pieces it is built from: ``outcome`` (``StreamResult``, the categories, the reply checks;
re-exported here), ``http_reply`` (the response read with its receive stamps, split into lines
as reads complete them) and ``sse_state`` (one reply's parse: token times, text, end). What
stays here is one class on purpose: a request's exchange (connect, send, headers, body, drain,
retry after a 429) shares one deadline and one connection's state from start to end.
"""

from __future__ import annotations

import email.utils
import functools
import ipaddress
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import gevent
from gevent import monkey
from gevent import socket as gsocket
from geventhttpclient.response import HTTPParseError

from loadgen.engine import stream_reader
from loadgen.engine.stream_reader import StreamReader
from targets.adapters.base import Adapter, BadChunk, PreparedRequest

if TYPE_CHECKING:
    pass

from loadgen.engine import http_reply
from loadgen.engine.http_reply import (
    HEAD_KEPT,
    BadBody,
    ClosedBeforeResponse,
    FirstByteTimeout,
    StampedResponse,
    enable_kernel_timestamps,
)
from loadgen.engine.outcome import (
    BAD_CHUNK,
    CLIENT_NETWORK,
    CONNECTION,
    EMPTY_REPLY,
    HTTP_3XX,
    HTTP_4XX,
    HTTP_5XX,
    HTTP_429,
    STREAM_CUT,
    TIMEOUT,
    StreamResult,
    check_reply,
    connect_error_category,
    empty_reply_message,
    fail,
    output_tokens,
)
from loadgen.engine.sse_state import RAW_READS, StreamState, stream_take

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


_perf_ns = time.perf_counter_ns
_USER_AGENT = "loadgen/0.1"
MAX_THROTTLE_RETRIES = 5


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
        # Where a worker counts the connects of all its sessions' connections (a one-item list
        # shared by them: loadgen.engine.connection_pool); None: only this connection's count.
        self.connect_count: list[int] | None = None
        self.current: StreamResult | None = None  # the request under way, or the last one
        # The reply under way, or the last one (what came of it: ``seen()``).
        self.last_response: StampedResponse | None = None

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
            pending=resp.pending(HEAD_KEPT),
        )

    def is_idle_open(self) -> bool:
        """Whether the connection is open with no request under way (its last reply read whole):
        it can carry another session's requests (``loadgen.engine.connection_pool``)."""
        return self._sock is not None and self._phase == "idle"

    def server_closed(self) -> bool:
        """Whether the open, idle connection can no longer carry a request: an idle connection has
        nothing to read, so readable means the server closed it (EOF) or sent something
        unsolicited. True when no connection is open."""
        sock = self._sock
        if sock is None:
            return True
        try:
            readable = _readable_now(sock.fileno())
        except (OSError, ValueError):
            return True
        return readable and not (self._tls and _only_tls_records(sock))

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
            resp = self.last_response = StampedResponse(
                sock, self._block_size, self._kernel_ts, self._max_line_bytes, prepared.stream and _compiled_reader()
            )
            res.t_send_ns = t_first_send_ns or _perf_ns()
            try:
                if self._idle_timeout_s is not None:
                    sock.settimeout(None)  # the first-byte timeout, not the idle one, bounds headers
                sock.sendall(payload)
                self._phase = "waiting for the response headers"
                self._read_headers(resp)
            except FirstByteTimeout:
                self.close()
                self._fail(
                    res,
                    TIMEOUT,
                    f"no complete response headers within {self._first_byte_timeout_s:g} s of sending "
                    f"the request (first-byte timeout; {resp.received} bytes came)",
                )
                return
            except (OSError, HTTPParseError, ClosedBeforeResponse) as e:
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

    def _read_headers(self, resp: StampedResponse) -> None:
        if self._first_byte_timeout_s is None:
            resp.read_headers()
            return
        timer = gevent.Timeout(self._first_byte_timeout_s, FirstByteTimeout())
        timer.start()
        try:
            resp.read_headers()
        finally:
            timer.close()

    def _read_stream(self, resp: StampedResponse, adapter: Adapter, res: StreamResult) -> None:
        st = StreamState(adapter.new_stream().parse_line, res, getattr(self._recv_delays, "chunks", None))
        take = stream_take(st)
        chunk_ns = res.chunk_ns
        res.streamed = True
        self._phase = "streaming"
        try:
            if self._reader is not None:
                self._follow(resp, st, take, self._reader)
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
                    if take(lines, t_recv_ns):
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

    def _follow(
        self, resp: StampedResponse, st: StreamState, take: Callable[[list[bytes], int], bool], reader: StreamReader
    ) -> None:
        """The body's lines through the worker's ``StreamReader`` (``loadgen.engine.stream_reader``):
        what came with the head first, then every read in the reader's greenlet."""
        delays = self._recv_delays
        while (lines := resp.take_lines()) is not None:
            if not lines:
                st.dispatch()
                return
            if delays is not None:
                delays.append(_perf_ns() - resp.t_recv_ns)
            if take(lines, resp.t_recv_ns):
                return
        consume = _consume_of(resp, st, take, delays)
        taker = getattr(consume, "__self__", None)
        if taker is None or not reader.compiled or not RAW_READS:
            reader.follow(self._sock, self._block_size, consume)
            return
        # The compiled poller reads into the taker in C, without a Python object per read; what
        # the taker kept goes onto the state however the following ends.
        try:
            reader.follow(self._sock, self._block_size, consume, taker.raw())
        finally:
            taker.flush()

    def _read_whole(self, resp: StampedResponse, adapter: Adapter, res: StreamResult) -> None:
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

    def _http_error(self, resp: StampedResponse, res: StreamResult, status: int) -> None:
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
        if self._sock is not None:
            if not self.server_closed():
                return False
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
        if self.connect_count is not None:
            self.connect_count[0] += 1
        return True

    def _release(self, resp: StampedResponse) -> None:
        """Keep the connection for the next request if the reply ended cleanly and allows it."""
        if not resp.keep_alive():
            self.close()

    def _drain(self, resp: StampedResponse) -> bool:
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
        except (OSError, HTTPParseError, BadChunk):
            # The reply stands; what came after its end (a broken body, a line past the limit,
            # a bad encoding) makes the connection one not to send on again.
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

    _fail = staticmethod(fail)


def _consume_of(
    resp: StampedResponse, st: StreamState, take: Callable[[list[bytes], int], bool], delays: list | None
) -> Callable[[bytes, int], bool]:
    """The stream reader's callback for one reply's reads: the receive delay, the read into the
    body reader, its lines to ``take`` (``st.dispatch`` at the body's end). In C where the compiled
    body reader and the compiled chunk path both read this reply (``_chat.ChatTaker.bind``), else
    this function's Python one, the reference."""
    taker = getattr(take, "__self__", None)
    body_reader = resp.compiled_body
    if body_reader is not None and hasattr(taker, "bind"):
        return taker.bind(resp, body_reader, delays)
    take_lines = resp.take_lines
    feed_body = resp.feed_body

    def consume(data: bytes, t_recv_ns: int) -> bool:
        resp.t_recv_ns = t_recv_ns
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

    return consume


def _compiled_reader() -> bool:
    """Whether a streamed body is read by the compiled reader (``http_reply.READER``, read per
    request so that a test can switch it)."""
    return http_reply.READER == "compiled"


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


# The system's poll, not gevent's: with a zero timeout gevent's also yields to the hub, a switch
# and a loop iteration per request for a question the kernel answers at once. Not select: it
# cannot take a descriptor past 1,023, and a worker holding a thousand connections has them, so
# every kept connection past it read as closed and was opened again.
_poll = monkey.get_original("select", "poll")
# POLLIN, POLLPRI, POLLERR, POLLHUP, POLLNVAL (a descriptor no longer open: no connection either)
_POLL_READABLE = 0x001 | 0x002 | 0x008 | 0x010 | 0x020


def _readable_now(fd: int) -> bool:
    """Whether ``fd`` has something to read (data, EOF, an error) right now, without waiting, or
    is no longer open."""
    p = _poll()
    p.register(fd, 0x001 | 0x002)
    return any(ev & _POLL_READABLE for _, ev in p.poll(0))


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
        e, ClosedBeforeResponse | ConnectionResetError | BrokenPipeError | ConnectionAbortedError
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
    if isinstance(e, ClosedBeforeResponse):
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
