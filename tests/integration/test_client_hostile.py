"""The streaming client against a hostile server (tests/hostile_server.py) on 127.0.0.1.

Each misbehaviour ends by its deadline as a record with its category: headers that never finish
(first-byte timeout, else the request deadline), headers then silence and a stall mid-stream
(idle timeout), a stream that never ends (request deadline), 429 with and without Retry-After
(waited out up to a cap and counted apart from failures), 503 while starting up, resets at
random byte offsets, redirects (never followed), gzip and unknown content encodings, chunked
trailers and HTTP/1.0 close-delimited bodies. Elapsed-time bounds are generous (2 shared cores):
they tell "ended by its deadline" from "waited for the server's own 30 s limit".
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import hostile_server
from tests.hostile_server import ok_response

HOSTILE = Path(hostile_server.__file__)
SLACK_S = 1.0  # how much later than its deadline a request may end on a busy machine


def start_hostile(*args: str) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(
        [sys.executable, str(HOSTILE), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    line = proc.stdout.readline()
    if not line.startswith("PORT "):
        proc.kill()
        raise RuntimeError(f"hostile server did not start: {line!r} {proc.stderr.read()[-2000:]}")
    return proc, int(line.split()[1])


_ids = iter(range(1_000_000))


def send(base: str, behaviour: str, *, deadline_s: float = 5.0, conn=None, **options):
    """One chat request to ``behaviour``; returns (result, seconds it took)."""
    from loadgen.engine.client import SessionConnection
    from targets.adapters.base import ChatRequest
    from targets.adapters.openai import OpenAIChatAdapter

    adapter = OpenAIChatAdapter()
    req = ChatRequest(
        messages=[{"role": "user", "content": "hi"}], max_tokens=4, session_id="s", request_id=f"h-{next(_ids)}"
    )
    own = conn is None
    conn = conn or SessionConnection(f"{base}/{behaviour}", **options)
    t0 = time.monotonic()
    try:
        return conn.stream(adapter.build_request(req), adapter, deadline_s=deadline_s), time.monotonic() - t0
    finally:
        if own:
            conn.close()


def test_ok_baseline(hostile):
    res, _ = send(hostile, "ok")
    assert res.ok and res.text == " t0 t1 t2 t3" and len(res.chunk_ns) == 4 and res.output_tokens == 4


def test_slowloris_headers_end_at_the_first_byte_timeout(hostile):
    res, took = send(hostile, "slowloris", deadline_s=20.0, first_byte_timeout_s=0.5)
    assert res.error_category == "timeout" and "first-byte timeout" in res.error_message
    assert 0.5 <= took < 0.5 + SLACK_S


def test_slowloris_without_first_byte_timeout_ends_at_the_request_deadline(hostile):
    res, took = send(hostile, "slowloris", deadline_s=0.6)
    assert res.error_category == "timeout"
    assert res.error_message == "deadline of 0.6 s passed while waiting for the response headers"
    assert 0.6 <= took < 0.6 + SLACK_S


def test_headers_then_silence_ends_at_the_idle_timeout(hostile):
    res, took = send(hostile, "silence", deadline_s=20.0, idle_timeout_s=0.4)
    assert res.error_category == "timeout" and res.http_status == 200
    assert res.error_message == "no data for 0.4 s after 0 token chunks (idle timeout)"
    assert 0.4 <= took < 0.4 + SLACK_S


def test_stall_mid_stream_ends_at_the_idle_timeout_with_its_tokens(hostile):
    res, took = send(hostile, "stall", deadline_s=20.0, idle_timeout_s=0.4)
    assert res.error_category == "timeout" and "after 2 token chunks (idle timeout)" in res.error_message
    assert len(res.chunk_ns) == 2 and res.t_first_ns is not None
    assert took < 0.4 + SLACK_S


def test_endless_stream_ends_at_the_request_deadline(hostile):
    # Data every 20 ms: the idle timeout never fires, the request deadline does.
    res, took = send(hostile, "endless", deadline_s=0.8, idle_timeout_s=0.4)
    assert res.error_category == "timeout" and "while streaming" in res.error_message
    assert len(res.chunk_ns) >= 5
    assert 0.8 <= took < 0.8 + SLACK_S


def test_429_with_retry_after_is_waited_out_and_counted_apart(hostile):
    res, took = send(hostile, "throttle-2", retry_after_cap_s=1.0)
    assert res.ok and res.throttled == 2 and res.text == " t0 t1 t2 t3"
    # Two waits of the asked 0.2 s; the request keeps its first send time, so TTFT includes them.
    assert took >= 0.4 and res.t_first_ns - res.t_send_ns >= 400_000_000


def test_429_fails_without_a_cap(hostile):
    res, took = send(hostile, "throttle-2")
    assert res.error_category == "http_429" and res.retry_after_s == 0.2 and res.throttled == 0
    assert took < SLACK_S


def test_429_without_retry_after_or_over_the_cap_fails_at_once(hostile):
    res, took = send(hostile, "throttle-bare", retry_after_cap_s=1.0)
    assert res.error_category == "http_429" and res.error_message.endswith("(no Retry-After)")
    res, took = send(hostile, "throttle-long", retry_after_cap_s=1.0)
    assert res.error_category == "http_429" and "Retry-After 3600 s is over the 1 s cap" in res.error_message
    assert res.throttled == 0 and took < SLACK_S


def test_429_retry_after_past_the_deadline_fails_at_once(hostile):
    # A 0.2 s Retry-After never fits in a 0.15 s deadline, however fast the first answer came.
    res, _ = send(hostile, "throttle-2", deadline_s=0.15, retry_after_cap_s=1.0)
    assert res.error_category == "http_429" and "past the request deadline" in res.error_message
    assert res.throttled == 0


def test_503_while_starting_up_then_served(hostile):
    from loadgen.engine.preflight import preflight
    from targets.adapters.openai import OpenAIChatAdapter
    from targets.errors import TargetError

    t0 = time.monotonic()
    res, _ = send(hostile, "startup-0.6")  # 503 for 0.6 s after this first request
    assert res.error_category == "http_5xx" and res.retry_after_s == 1.0
    assert res.error_message == 'HTTP 503: {"error": {"message": "hostile Service Unavailable", "code": 503}}'
    with pytest.raises(TargetError, match=r"not ready \(still loading the model\?\)"):
        preflight(f"{hostile}/startup-0.6", OpenAIChatAdapter(), timeout_s=2.0)
    time.sleep(max(0.0, 0.7 - (time.monotonic() - t0)))
    res, _ = send(hostile, "startup-0.6")
    assert res.ok and res.text == " t0 t1 t2 t3"


def test_resets_at_random_byte_offsets_end_by_category(hostile):
    whole = ok_response(4)
    header_end = whole.index(b"\r\n\r\n") + 4
    done_end = whole.index(b"data: [DONE]\n") + len(b"data: [DONE]\n")
    rng = random.Random(7)
    offsets = sorted({1, header_end - 1, header_end, done_end - 1, done_end, *rng.sample(range(1, len(whole)), 10)})
    for offset in offsets:
        res, took = send(hostile, f"reset-{offset}", deadline_s=5.0)
        assert took < SLACK_S, offset
        if offset < header_end:
            assert res.error_category == "connection", (offset, res.error_message)
        elif offset < done_end:
            assert res.error_category == "stream_cut", (offset, res.error_message)
        else:
            assert res.ok, (offset, res.error_message)  # [DONE] came: the reset only cut the drain


def test_redirect_is_not_followed(hostile):
    from loadgen.engine.preflight import preflight
    from targets.adapters.openai import OpenAIChatAdapter
    from targets.errors import TargetError

    res, _ = send(hostile, "redirect")
    assert res.error_category == "http_3xx"
    assert res.error_message == "HTTP 307: redirect to /ok/v1/chat/completions, not followed"
    with pytest.raises(TargetError, match="redirects to /ok/v1/chat/completions: give that URL as the target"):
        preflight(f"{hostile}/redirect", OpenAIChatAdapter(), timeout_s=2.0)


def test_gzip_stream_is_decoded_chunk_by_chunk(hostile):
    res, _ = send(hostile, "gzip")
    assert res.ok and res.text == " t0 t1 t2 t3" and len(res.chunk_ns) == 4 and res.output_tokens == 4


def test_unknown_content_encoding_is_bad_chunk(hostile):
    res, _ = send(hostile, "brotli")
    assert res.error_category == "bad_chunk" and "Content-Encoding 'br'" in res.error_message


def test_chunked_trailers_are_read_and_the_connection_kept(hostile):
    from loadgen.engine.client import SessionConnection

    with SessionConnection(f"{hostile}/trailers") as conn:
        first, _ = send(hostile, "trailers", conn=conn)
        second, _ = send(hostile, "trailers", conn=conn)
    assert first.ok and second.ok and second.reused_connection and conn.connections_opened == 1


def test_http10_close_delimited_body_is_complete_and_not_reused(hostile):
    from loadgen.engine.client import SessionConnection

    with SessionConnection(f"{hostile}/http10") as conn:
        first, _ = send(hostile, "http10", conn=conn)
        second, _ = send(hostile, "http10", conn=conn)
    assert first.ok and first.text == " t0 t1 t2 t3" and second.ok
    assert not second.reused_connection and conn.connections_opened == 2


@pytest.mark.parametrize("reader", ["compiled", "python"])
def test_a_bad_line_after_the_end_marker_keeps_the_reply_and_drops_the_connection(hostile, reader, monkeypatch):
    # The drain after [DONE] let a line past the limit escape as an exception: the session's
    # greenlet died with a traceback, and the request the server answered had no record.
    from loadgen.engine import http_reply
    from loadgen.engine.client import SessionConnection

    if reader == "compiled" and http_reply.READER != "compiled":
        pytest.skip("the compiled reader is not built")
    monkeypatch.setattr(http_reply, "READER", reader)
    with SessionConnection(f"{hostile}/tail-200", max_line_bytes=64) as conn:
        res, _ = send(hostile, "tail-200", conn=conn)
        assert res.ok and len(res.chunk_ns) == 4, res.error_message
        assert not conn.is_idle_open()  # what came after the reply is not trusted: not kept
        again, _ = send(hostile, "ok", conn=conn)
        assert again.ok and not again.reused_connection
