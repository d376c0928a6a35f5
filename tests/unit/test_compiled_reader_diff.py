"""The compiled body reader (loadgen/engine/_reader.c) against the Python path it mirrors: the same
reply bytes, split into reads anywhere, give the same lines, the same end and the same kind of
error through both (StampedResponse with and without ``compiled``)."""

from __future__ import annotations

import pytest
from geventhttpclient.response import HTTPParseError
from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.engine import http_reply
from loadgen.engine.http_reply import BadBody, StampedResponse

pytestmark = pytest.mark.skipif(
    http_reply._reader is None, reason="the compiled reader is not built (make setup builds it)"
)


class _Reads:
    """A socket whose reads return the given pieces, then b"" (the peer closed)."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = list(pieces)

    def recv(self, _n: int) -> bytes:
        return self.pieces.pop(0) if self.pieces else b""


def _read(pieces: list[bytes], compiled: bool, max_line: int = 1 << 16) -> tuple:
    """Every batch of lines the reply gives, how it ended, and whether the compiled reader ran."""
    resp = StampedResponse(_Reads(pieces), 65536, False, max_line, compiled)
    batches: list[list[bytes]] = []
    try:
        resp.read_headers()
        while lines := resp.read_lines():
            batches.append(lines)
        end = ("complete", resp.keep_alive())
    except BadBody:
        end = ("bad_chunk", None)
    except HTTPParseError:
        end = ("stream_cut", None)
    except Exception as e:  # the head never completed
        end = (type(e).__name__, None)
    # Batches depend on where reads end; the lines and the end do not.
    return [line for b in batches for line in b], end, resp.ended_mid_line, resp.reader


def _same(pieces: list[bytes], max_line: int = 1 << 16) -> None:
    py = _read(pieces, False, max_line)
    c = _read(pieces, True, max_line)
    assert py[3] == "python"
    assert c[:3] == py[:3]


CHAT = [
    b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}',
    b'data: {"choices":[{"index":0,"delta":{"content":"Hel"}}]}',
    b'data: {"choices":[{"index":0,"delta":{"reasoning_content":"hm"}}]}',
    b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]}}]}',
    b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}',
    b'data: {"error":{"message":"overloaded","code":503}}',
    b": keep-alive",
    b"event: message",
    b"data: [DONE]",
]


def _chunked(body: bytes, sizes: list[int], ext: bytes = b"") -> bytes:
    out, i = b"", 0
    for n in [*sizes, len(body)]:
        part = body[i : i + max(1, n)]
        if not part:
            break
        out += b"%x%s\r\n%s\r\n" % (len(part), ext, part)
        i += len(part)
    return out + b"0\r\n\r\n"


HEAD_CHUNKED = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def _sse(eol: bytes, bom: bool = False) -> bytes:
    return (b"\xef\xbb\xbf" if bom else b"") + b"".join(line + eol + eol for line in CHAT)


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"])
def test_every_split_of_a_chunked_stream_reads_the_same(eol: bytes) -> None:
    reply = HEAD_CHUNKED + _chunked(_sse(eol, bom=True), [7, 1, 30], b';a=1;b="x y"')
    assert _read([reply], True)[3] == "compiled"
    for cut in range(1, len(reply)):
        _same([reply[:cut], reply[cut:]])


def test_identity_and_close_delimited_bodies_read_the_same() -> None:
    body = _sse(b"\n")
    length = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    closed = b"HTTP/1.0 200 OK\r\n\r\n" + body + b"data: cut"
    for reply in (length, closed, length[:-5]):
        for cut in range(1, len(reply), 7):
            _same([reply[:cut], reply[cut:]])


@pytest.mark.parametrize(
    "body",
    [
        b"zz\r\nabc\r\n",  # a size that is not hex
        b"3\nabc\r\n0\r\n\r\n",  # LF without its CR
        b"3\r\nabcX\r\n0\r\n\r\n",  # the chunk is longer than its size
        b"fffffffffffffffff\r\n",  # a size past 64 bits
        b"5\r\ndata:",  # truncated
        b"3\r\nabc\r\n0\r\n\r\nGARBAGE",  # bytes after the end
    ],
)
def test_broken_framing_fails_the_same(body: bytes) -> None:
    _same([HEAD_CHUNKED + body])


def test_an_oversized_line_fails_the_same() -> None:
    _same([HEAD_CHUNKED, _chunked(b"data: " + b"x" * 5000, [1000])], max_line=4096)


def test_compressed_bodies_stay_on_the_python_path() -> None:
    reply = b"HTTP/1.1 200 OK\r\nContent-Encoding: br\r\nContent-Length: 2\r\n\r\nab"
    assert _read([reply], True)[3] == "python"


@settings(max_examples=300, deadline=None)
@given(
    lines=st.lists(
        st.sampled_from([*CHAT, b"", b"data: \xef\xbb\xbf", b"x\ry", b"data: a\r"]), min_size=1, max_size=12
    ),
    eols=st.lists(st.sampled_from([b"\n", b"\r\n", b"\r"]), min_size=1, max_size=12),
    sizes=st.lists(st.integers(1, 40), max_size=6),
    cuts=st.lists(st.integers(1, 400), max_size=6),
    chunked=st.booleans(),
)
def test_random_streams_and_reads_read_the_same(lines, eols, sizes, cuts, chunked) -> None:
    body = b"".join(line + eols[i % len(eols)] for i, line in enumerate(lines))
    if chunked:
        reply = HEAD_CHUNKED + _chunked(body, sizes)
    else:
        reply = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    pieces, i = [], 0
    for n in cuts:
        pieces.append(reply[i : i + n])
        i += n
    pieces.append(reply[i:])
    _same([p for p in pieces if p], max_line=64)
