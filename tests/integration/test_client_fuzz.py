"""Property tests of the streaming client over real loopback sockets: any framing, any split.

A gevent server in this process writes a scripted reply in pieces cut at arbitrary offsets (inside
status lines, ``data:`` prefixes, UTF-8 characters and chunk-size lines), yielding between pieces
so the client reads each on its own; the client's receive size is drawn too (down to one byte).
The reply varies in framing (chunked with or without trailers, Content-Length, HTTP/1.0 close-
delimited), compression (gzip, flushed per event), line ends, SSE noise, and how it ends (one or
two ``[DONE]``, none, an error event, a cut, invalid JSON, non-UTF-8 bytes). Each case ends as a
correct result or its named error category, never as an exception.
"""

from __future__ import annotations

import itertools
import json
import zlib

import gevent
import pytest
from gevent.server import StreamServer
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from loadgen.engine.client import SessionConnection
from targets.adapters.base import ChatRequest
from targets.adapters.openai import OpenAIChatAdapter

ADAPTER = OpenAIChatAdapter()


@pytest.fixture(scope="module")
def scripted():
    """A loopback server that answers every request with ``box["pieces"]``, then closes."""
    box: dict = {"pieces": []}

    def handle(sock, _addr):
        data = b""
        while b"\r\n\r\n" not in data:
            got = sock.recv(65536)
            if not got:
                return
            data += got
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        while len(body) < length:
            body += sock.recv(65536)
        try:
            for piece in box["pieces"]:
                sock.sendall(piece)
                gevent.sleep(0)  # the client reads this piece before the next is written
        except OSError:
            pass
        sock.close()

    server = StreamServer(("127.0.0.1", 0), handle)
    server.start()
    yield f"http://127.0.0.1:{server.server_port}", box
    server.stop(timeout=1)


def request() -> bytes:
    req = ChatRequest(messages=[{"role": "user", "content": "hi"}], max_tokens=8, session_id="s", request_id="r")
    return ADAPTER.build_request(req)


def _line(obj: dict) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode()


def compose(tokens, eol, prefix, noise, ending, error_code):
    """The SSE body and what the client must make of it: (body, category, text, token chunks)."""
    events = [_line({"choices": [{"delta": {"role": "assistant", "content": ""}}]})]
    events += [_line({"choices": [{"delta": {"content": t}}]}) for t in tokens]
    category, n = None, len(tokens)
    if ending == "error":
        events.append(_line({"error": {"message": "failed mid-stream", "code": error_code}}))
        category = {429: "http_429", 400: "http_4xx"}.get(error_code, "http_5xx")
    elif ending == "bad-json":
        events.append(b'{"choices": [{"delta": ')
        category = "bad_chunk"
    elif ending == "non-utf8":
        events.append(b'{"choices": [{"delta": {"content": "\xff\xfe"}}]}')
        category = "bad_chunk"
    else:
        events.append(_line({"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": n}}))
        if ending in ("done", "done-twice"):
            events.append(b"[DONE]")
        if ending == "done-twice":
            events.append(b"[DONE]")
        if ending in ("missing-done", "cut"):
            category = "stream_cut"
    out = []
    for i, e in enumerate(events):
        out += [x + eol for x in noise[i % len(noise)]]
        out.append(prefix + e + eol + eol)
    body = b"".join(out)
    if ending == "cut":
        body = body[: max(1, len(body) - 7)]  # mid-line, before the end of the body
    return body, category, "".join(tokens), n


def frame(body: bytes, framing: str, gzip: bool, cuts: list[int], trailers: bool, cut_body: bool) -> bytes:
    if gzip:
        z = zlib.compressobj(6, zlib.DEFLATED, 31)
        parts = [z.compress(body[a:b]) + z.flush(zlib.Z_SYNC_FLUSH) for a, b in _spans(len(body), cuts)]
        parts.append(z.flush())
        if cut_body:
            parts = parts[:-1]
    else:
        parts = [body[a:b] for a, b in _spans(len(body), cuts)]
    payload = b"".join(parts)
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    if gzip:
        head += b"Content-Encoding: gzip\r\n"
    if framing == "http10":
        return b"HTTP/1.0" + head[len(b"HTTP/1.1") :] + b"\r\n" + payload
    if framing == "length":
        declared = len(payload) + (5 if cut_body else 0)
        return head + b"Content-Length: %d\r\n\r\n" % declared + payload
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts if p)
    if cut_body:
        return head + b"Transfer-Encoding: chunked\r\n\r\n" + chunks
    end = b"0\r\nX-Trailer: yes\r\n\r\n" if trailers else b"0\r\n\r\n"
    return head + b"Transfer-Encoding: chunked\r\n\r\n" + chunks + end


def _spans(n: int, cuts: list[int]) -> list[tuple[int, int]]:
    points = sorted({0, n, *(c % (n + 1) for c in cuts)})
    return list(itertools.pairwise(points))


NOISE = (b": ping", b"event: message", b"id: 3", b"retry: 10", b"")


@settings(max_examples=70, derandomize=True, deadline=3000, suppress_health_check=list(HealthCheck))
@given(
    tokens=st.lists(st.text(min_size=1, max_size=4), max_size=6),
    eol=st.sampled_from([b"\n", b"\r\n"]),
    prefix=st.sampled_from([b"data: ", b"data:"]),
    noise=st.lists(st.lists(st.sampled_from(NOISE), max_size=2), min_size=3, max_size=3),
    ending=st.sampled_from(["done", "done", "done-twice", "missing-done", "error", "cut", "bad-json", "non-utf8"]),
    error_code=st.sampled_from([429, 400, 503, None]),
    framing=st.sampled_from(["chunked", "length", "http10"]),
    gzip=st.booleans(),
    trailers=st.booleans(),
    body_cuts=st.lists(st.integers(0, 10_000), max_size=6),
    tcp_cuts=st.lists(st.integers(0, 10_000), max_size=12),
    block_size=st.sampled_from([1, 3, 16, 65536]),
)
@example(  # a close-delimited body cut mid-line: its fragment is a cut, not a bad chunk
    tokens=["a", "é"], eol=b"\n", prefix=b"data: ", noise=[[], [], []], ending="cut", error_code=None,
    framing="http10", gzip=False, trailers=False, body_cuts=[], tcp_cuts=[40, 90], block_size=16,
)
def test_any_framing_and_split_ends_in_a_result_or_its_category(
    scripted, tokens, eol, prefix, noise, ending, error_code, framing, gzip, trailers, body_cuts, tcp_cuts, block_size
):
    base, box = scripted
    body, category, text, n = compose(tokens, eol, prefix, noise, ending, error_code)
    cut_body = ending == "cut" and framing != "http10"
    if ending == "cut" and framing == "http10":
        category = "stream_cut"  # close-delimited: the cut is the end, and [DONE] never came
    wire = frame(body, framing, gzip, body_cuts, trailers, cut_body)
    box["pieces"] = [wire[a:b] for a, b in _spans(len(wire), tcp_cuts)]
    with SessionConnection(base, block_size=block_size) as conn:
        res = conn.stream(request(), ADAPTER, deadline_s=5.0)
    assert res.error_category == category, (res.error_category, res.error_message)
    if category is None:
        assert res.text == text
        assert len(res.chunk_ns) == n and res.output_tokens == n
    elif category.startswith("http_"):
        assert res.text == text and "failed mid-stream" in res.error_message


def test_a_line_over_1_mib_is_read_whole(scripted):
    base, box = scripted
    big = "x" * (1_500_000)
    body, _, _, _ = compose([big, "y"], b"\n", b"data: ", [[]], "done", None)
    box["pieces"] = [frame(body, "chunked", False, [100_000 * k for k in range(1, 16)], False, False)]
    with SessionConnection(base) as conn:
        res = conn.stream(request(), ADAPTER, deadline_s=5.0)
    assert res.ok and res.text == big + "y" and len(res.chunk_ns) == 2


def test_a_line_over_the_limit_is_bad_chunk_not_unbounded_memory(scripted):
    base, box = scripted
    body, _, _, _ = compose(["x" * 300_000], b"\n", b"data: ", [[]], "done", None)
    box["pieces"] = [frame(body, "length", False, [], False, False)]
    with SessionConnection(base, max_line_bytes=64 << 10) as conn:
        res = conn.stream(request(), ADAPTER, deadline_s=5.0)
    assert res.error_category == "bad_chunk" and "longer than 65536 bytes" in res.error_message
