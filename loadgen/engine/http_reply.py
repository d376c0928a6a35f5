"""One HTTP response read off a socket with the kernel's receive stamps: ``StampedResponse``
(geventhttpclient's parser, fed by ``recv``/``recvmsg`` so each read keeps its arrival time), the
line splitting of a streamed body as its reads complete lines, and the body errors a reply can
end in (``BadBody``, ``FirstByteTimeout``, ``ClosedBeforeResponse``).
"""

from __future__ import annotations

import os
import re
import socket
import struct
import time
import zlib
from typing import TYPE_CHECKING

from geventhttpclient.response import HTTPParseError, HTTPResponse

from loadgen.engine.kernel_clock import kernel_stamps_agree
from targets.adapters.base import BadChunk

if TYPE_CHECKING:
    pass

try:  # the compiled body reader (loadgen/engine/_reader.c), built by the install where it can be
    from loadgen.engine import _reader
except ImportError:
    _reader = None

# Which reader streams a reply body: "compiled" (loadgen.engine._reader: de-framing and line
# splitting in C) when it is built, else "python" (geventhttpclient's parser and take_lines below,
# the reference the compiled one is tested against). LOADGEN_READER=python forces the Python one.
READER = "compiled" if _reader is not None and os.environ.get("LOADGEN_READER", "") != "python" else "python"


# zlib window bits: 32 + 15 reads a zlib or a gzip header, whichever the body starts with.
_INFLATE_WBITS = {"gzip": 47, "x-gzip": 47, "deflate": 47}


class BadBody(BadChunk):
    """The body itself cannot be read into lines (an unknown ``Content-Encoding``, data that does
    not decompress, a line over ``max_line_bytes``): ``bad_chunk``, but no adapter's doing."""


class FirstByteTimeout(Exception):
    """The response headers did not arrive within the first-byte timeout."""


class ClosedBeforeResponse(Exception):
    """The peer closed the connection before a complete status line and headers."""

    def __init__(self, received: int) -> None:
        super().__init__("connection closed before the response headers")
        self.received = received


HEAD_KEPT = 256  # bytes of a response's start kept to say what came (the preflight's messages)


_BOM = b"\xef\xbb\xbf"  # UTF-8 byte order mark, dropped at the start of a stream (SSE spec)


_ANY_EOL = re.compile(rb"\r\n|\r|\n")


_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux; SCM_TIMESTAMPNS has the same value


_ANC_SIZE = socket.CMSG_SPACE(16)  # one struct timespec


_perf_ns = time.perf_counter_ns
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


def arrival_ns(anc: list) -> int:
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


class StampedResponse(HTTPResponse):
    """geventhttpclient's C HTTP/1.1 parser (chunked and close-delimited bodies) over our socket,
    with a line reader that remembers when the bytes of the returned line arrived."""

    def __init__(
        self,
        sock: socket.socket,
        block_size: int,
        kernel_timestamps: bool = False,
        max_line_bytes: int = 8 << 20,
        compiled: bool = False,
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
        self._ended_mid_line = False  # the body ended with a line that has no newline
        # A streamed 2xx body is read by the compiled reader when asked (and it is built): the
        # parser then sees only the head, and the body's bytes go to it (``_body_reader``).
        self._compiled = compiled and _reader is not None
        self._body_reader = None
        self._head_tail = b""  # the last bytes of the head fed so far (its end may span reads)
        self._interim = False  # a 1xx reply came before the final one
        self.head_bytes = b""  # the first bytes that came, up to HEAD_KEPT (what the server said)
        self._at_start = True  # no body line returned yet (a leading byte order mark is dropped)
        self._any_eol = False  # a lone CR was seen: lines end at CR, LF or CRLF from now on
        # A flag, not a bound method kept on self: that would be a reference cycle, and every
        # reply (its socket, headers and buffers) would wait for the cyclic collector, whose
        # passes over them stalled a busy worker for 10-30 ms.
        self._kernel_timestamps = kernel_timestamps

    def _recv(self) -> bytes:
        if self._kernel_timestamps:
            data, anc, _flags, _addr = self.sock.recvmsg(self.block_size, _ANC_SIZE)
            self.t_recv_ns = arrival_ns(anc)
            return data
        data = self.sock.recv(self.block_size)
        self.t_recv_ns = _perf_ns()
        return data

    @property
    def ended_mid_line(self) -> bool:
        """The body ended with a line that has no line end (a close-delimited body cut mid-line)."""
        r = self._body_reader
        return r.ended_mid_line if r is not None else self._ended_mid_line

    @property
    def compiled_body(self) -> object | None:
        """The compiled ``BodyReader`` reading this body, or None on the Python path."""
        return self._body_reader

    @property
    def reader(self) -> str:
        """Which reader read this body: "compiled" or "python"."""
        return "compiled" if self._body_reader is not None else "python"

    def read_headers(self) -> None:
        while not self.headers_complete or self.get_code() < 200:
            data = self._recv()
            if not data:
                raise ClosedBeforeResponse(self.received)
            if self.received < HEAD_KEPT:
                self.head_bytes += data[: HEAD_KEPT - self.received]
            self.received += len(data)
            if self._compiled:
                self._feed_head(data)
            else:
                self.feed(data)

    def _feed_head(self, data: bytes) -> None:
        """``feed`` for the compiled reader: the parser gets the head up to its blank line; the
        body's bytes after it go to a ``BodyReader`` when the reply is one it reads (else to the
        parser, as on the Python path)."""
        while data:
            seen = self._head_tail + data
            end = seen.find(b"\r\n\r\n")
            if end < 0:
                self._head_tail = seen[-3:]
                self.feed(data)
                return
            cut = end + 4 - len(self._head_tail)  # the head's end, as an offset into data
            self._head_tail = b""
            self.feed(data[:cut])
            data = data[cut:]
            if not self.headers_complete:  # the parser did not end its head there: it reads on
                self._compiled = False
                self.feed(data)
                return
            if self.get_code() >= 200:
                break
            self._interim = True
        else:
            return  # the read ended with a 1xx reply's head: the final head is still to come
        self._compiled = False
        mode = self._body_mode()
        if mode is None:
            if data:
                self.feed(data)
            return
        kind, length = mode
        self._body_reader = r = _reader.BodyReader(kind, length, self.max_line_bytes, HTTPParseError, BadBody)
        self.message_complete = r.complete
        # The hot path calls the compiled reader's take_lines directly (its method, not one of
        # self's: a bound method of self kept on self is a reference cycle; see _recv).
        self.take_lines = r.take_lines
        if data:
            self._feed_compiled(data)

    def _body_mode(self) -> tuple[int, int] | None:
        """How the compiled reader frames this reply's body, or None where the Python path reads it
        (no body by status, an encoding to decode, a framing it leaves to the parser)."""
        code = self.get_code()
        if not 200 <= code < 300 or code == 204:
            return None
        if self._interim:
            # After a 1xx reply the parser keeps that reply's keep-alive answer until it sees the
            # final one end, which it would not on the compiled path: the parser reads it all.
            return None
        encoding = self.get("content-encoding")
        if encoding is not None and (not isinstance(encoding, str) or encoding.strip().lower() != "identity"):
            return None
        transfer = self.get("transfer-encoding")
        length = self.get("content-length")
        if transfer is not None:
            # llhttp takes "chunked" with trailing spaces only (a tab after it names another coding,
            # and the body is read to the close): anything else goes to the parser.
            if length is not None or not isinstance(transfer, str) or transfer.rstrip(" ").lower() != "chunked":
                return None
            return _reader.MODE_CHUNKED, 0
        if length is None:
            return _reader.MODE_CLOSE, 0
        if not isinstance(length, str) or not length.strip().isdigit():
            return None
        return _reader.MODE_LENGTH, int(length)

    def _feed_compiled(self, data: bytes) -> None:
        r = self._body_reader
        r.feed(data)  # type: ignore[union-attr]
        self.message_complete = r.complete  # type: ignore[union-attr]

    def _on_message_begin(self) -> None:
        # After a final (2xx-5xx) response has ended, llhttp reads any further byte but CR/LF as a
        # new response and geventhttpclient would start it on the same object, replacing the
        # headers under the body already read. No request asked for it: fail as the compiled
        # reader does (only a 1xx reply is followed by another on the same parser).
        if self.message_complete and self.get_code() >= 200:
            raise HTTPParseError("data after the end of the response")
        super()._on_message_begin()

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
        if self._body_reader is not None:
            self._feed_compiled(data)
            return
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
                self._ended_mid_line = True
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
                self._ended_mid_line = True
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
        r = self._body_reader
        if r is not None:
            while not r.complete and r.buffered <= limit:
                self._fill()
            return r.take_body(limit)
        buf = self._body_buffer
        while not self.message_complete and len(buf) <= limit:
            self._fill()
        if self._undecodable is not None:
            raise BadBody(self._undecodable)
        out = bytes(buf[:limit])
        buf.clear()
        self._scan_from = 0
        return out

    def pending(self, limit: int) -> bytes:
        """The first ``limit`` body bytes buffered and not yet read (what came, for messages)."""
        r = self._body_reader
        return r.pending(limit) if r is not None else bytes(self._body_buffer[:limit])

    def keep_alive(self) -> bool:
        if self._body_reader is not None:
            return self._body_reader.complete and self.should_keep_alive()
        return self.message_complete and not self.parser_failed() and self.should_keep_alive()
