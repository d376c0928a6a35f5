"""The oracle for the compiled body reader: one reply, cut into reads, goes through
``StampedResponse`` twice, on the Python path (geventhttpclient's llhttp parser and
``take_lines``, the reference) and on the compiled one (loadgen/engine/_reader.c); the two must
give the same outcome. The fuzzer (tests/fuzz/fuzz_reader.py) and the corpus replay test
(tests/unit/test_reader_corpus.py) both judge with ``difference``.

An outcome is: the lines each read returned (so a line is stamped with the same read's arrival
time on both paths; SSE events are groups of these lines, so equal lines mean equal events), how
the body ended (complete and whether the connection is reusable, or the error category with its
message), and whether it ended mid-line.

Messages are compared as the text a run's record shows: llhttp's framing errors carry llhttp's
wording on both paths (the Python path's error holds a (message, code) pair; its message is
compared). Two ends are worded by each path in its own way and count as equal (``_same_end``):
the peer closing mid-body (llhttp's "Incomplete response."), and bytes after the end of a reply
whose connection is not kept alive (llhttp's "Data after `Connection: close`"; the compiled
reader does not see the head, and says "data after the end of the response" for every reply).

One difference is known and let through (``KNOWN``): a ``Connection`` or ``Transfer-Encoding``
field in the trailer section (``Connection: close`` after the last chunk, or a coding other than
chunked) changes llhttp's keep-alive answer (and, for a body cut after it, its message: "Invalid
EOF state"), while the compiled path takes the keep-alive answer from the head alone. No
streaming server sends connection options or codings as trailers; reading them would need the
reader to report them to ``StampedResponse.keep_alive``.
"""

from __future__ import annotations

from geventhttpclient.response import HTTPParseError

from loadgen.engine import http_reply
from loadgen.engine.http_reply import BadBody, StampedResponse

CLOSED_MID_BODY = "connection closed mid-body"
AFTER_THE_END = "data after the end of the response"


class _Reads:
    """A socket whose reads return the given pieces, then b"" (the peer closed)."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = list(pieces)

    def recv(self, _n: int) -> bytes:
        return self.pieces.pop(0) if self.pieces else b""


def _message(e: BaseException) -> str:
    """The error's text: llhttp's message without its code on the Python path."""
    if isinstance(e, HTTPParseError) and e.args and isinstance(e.args[0], str):
        return e.args[0]
    return str(e)


def read_reply(pieces: list[bytes], compiled: bool, max_line: int) -> tuple:
    """(lines by read, end, ended_mid_line, reader) for one reply cut into ``pieces``."""
    resp = StampedResponse(_Reads(pieces), 65536, False, max_line, compiled)  # type: ignore[arg-type]
    batches: list[list[bytes]] = []
    try:
        resp.read_headers()
        while lines := resp.read_lines():
            batches.append(lines)
        end: tuple = ("complete", resp.keep_alive())
    except BadBody as e:
        end = ("bad_chunk", str(e))
    except HTTPParseError as e:
        end = ("stream_cut", _message(e))
    except http_reply.ClosedBeforeResponse as e:
        end = ("closed_before_response", e.received)
    # Anything else (a SystemError, a TypeError out of the C code) propagates: a crash, not an end.
    return batches, end, resp.ended_mid_line, resp.reader


_SAME_END = {
    ("Incomplete response.", CLOSED_MID_BODY),
    ("Data after `Connection: close`", AFTER_THE_END),
}

KNOWN = "keep-alive after a Connection or Transfer-Encoding trailer field"
_KEEP_ALIVE_TRAILERS = (b"connection", b"transfer-encoding")


def _same_end(py: tuple, c: tuple) -> bool:
    if py == c:
        return True
    return py[0] == c[0] == "stream_cut" and (py[1], c[1]) in _SAME_END


def _known(pieces: list[bytes], py: tuple, c: tuple) -> bool:
    """The one known difference: after a Connection or Transfer-Encoding trailer field, the same
    kind of end with another keep-alive answer or, cut there, another message."""
    if py[1][0] != c[1][0] or py[1][0] not in ("complete", "stream_cut"):
        return False
    reply = b"".join(pieces)
    trailers = _trailer_section(reply[reply.find(b"\r\n\r\n") + 4 :]).lower()
    return any(name in trailers for name in _KEEP_ALIVE_TRAILERS)


def _trailer_section(body: bytes) -> bytes:
    """What follows the last chunk of a chunked body (b"" where the chunks do not parse)."""
    i = 0
    while True:
        eol = body.find(b"\r\n", i)
        size = body[i:eol].split(b";", 1)[0]
        if eol < 0 or not size or any(c not in b"0123456789abcdefABCDEF" for c in size):
            return b""
        n = int(size, 16)
        if n == 0:
            return body[eol + 2 :]
        i = eol + 2 + n + 2


def difference(pieces: list[bytes], max_line: int) -> str | None:
    """None when both readers agree on this reply cut into ``pieces``, else what differs."""
    py = read_reply(pieces, False, max_line)
    c = read_reply(pieces, True, max_line)
    if py[3] != "python":
        return f"the Python path ran the {py[3]} reader"
    if c[0] != py[0]:
        return f"lines differ:\n  python   {py[0]!r}\n  compiled {c[0]!r}"
    if not _same_end(py[1], c[1]) and not _known(pieces, py, c):
        return f"ends differ: python {py[1]!r}, compiled {c[1]!r}"
    if c[2] != py[2]:
        return f"ended_mid_line differs: python {py[2]}, compiled {c[2]}"
    return None


def cuts_of(reply: bytes, ends: list[int]) -> list[bytes]:
    """``reply`` cut at the sorted offsets ``ends`` (empty pieces dropped: b"" means closed)."""
    pieces, i = [], 0
    for j in [*sorted(set(ends)), len(reply)]:
        if j > i:
            pieces.append(reply[i:j])
            i = j
    return pieces
