"""The preflight ends by one deadline and reads the reply as the load will (tests/hostile_server.py).

Headers trickled byte by byte, headers then silence, a body that never completes a line: each ends
within the preflight's deadline (its own, capped by ``--request-timeout``; ``--first-byte-timeout``
bounds the headers) with a line that says what came. What the load path reads (gzip, CR-only line
ends, a byte order mark, multi-line ``data:``) passes with its tokens; what it fails is refused.
"""

from __future__ import annotations

import time

import pytest

from loadgen.engine.preflight import preflight
from loadgen.errors import UserError
from targets.adapters.openai import OpenAIChatAdapter
from targets.errors import TargetError

SLACK_S = 3.0  # a busy 2-core machine: ends within its deadline plus this


def refused(base: str, behaviour: str, **kw) -> tuple[str, float]:
    t0 = time.monotonic()
    with pytest.raises(TargetError) as e:
        preflight(f"{base}/{behaviour}", OpenAIChatAdapter(), **kw)
    msg = str(e.value)
    assert "\n" not in msg
    return msg, time.monotonic() - t0


def test_trickled_headers_end_at_the_deadline_and_say_what_came(hostile):
    msg, took = refused(hostile, "slowloris", timeout_s=1.5)
    assert took < 1.5 + SLACK_S
    url = f"{hostile}/slowloris/v1/chat/completions"
    assert msg.startswith(f"target {url}: headers incomplete after 1.5 s: ")
    assert "bytes came" in msg and "HTTP/1.1 200 OK" in msg


def test_the_first_byte_timeout_bounds_the_headers(hostile):
    msg, took = refused(hostile, "slowloris", timeout_s=10.0, first_byte_timeout_s=0.5)
    assert took < 0.5 + SLACK_S
    assert "headers incomplete after 0.5 s" in msg and "first-byte timeout" in msg


def test_the_request_timeout_caps_the_deadline(hostile):
    msg, took = refused(hostile, "silence", timeout_s=10.0, request_timeout_s=1.0)
    assert took < 1.0 + SLACK_S
    assert "answered 200 with text/event-stream but streamed nothing within 1 s" in msg


def test_a_body_that_never_completes_a_line_ends_at_the_deadline(hostile):
    msg, took = refused(hostile, "trickle", timeout_s=1.5)
    assert took < 1.5 + SLACK_S
    assert "but no complete line within 1.5 s" in msg and "'ddd" in msg


def test_loadgen_run_passes_its_timeouts_to_the_preflight(hostile):
    from loadgen.commands.run import RunOptions
    from loadgen.commands.run import preflight as run_preflight

    t0 = time.monotonic()
    with pytest.raises(UserError, match="headers incomplete after 1 s"):
        run_preflight(RunOptions(request_timeout="1s"), f"{hostile}/slowloris")
    assert time.monotonic() - t0 < 1.0 + SLACK_S
    t0 = time.monotonic()
    with pytest.raises(UserError, match=r"headers incomplete after 0\.5 s.*first-byte timeout"):
        run_preflight(RunOptions(first_byte_timeout="0.5s"), f"{hostile}/slowloris")
    assert time.monotonic() - t0 < 0.5 + SLACK_S


@pytest.mark.parametrize("behaviour", ["ok", "gzip", "cr", "bom", "multiline", "trailers", "http10"])
def test_what_the_load_path_reads_passes(hostile, behaviour):
    info = preflight(f"{hostile}/{behaviour}", OpenAIChatAdapter(), timeout_s=5.0)
    assert info["status"] == 200 and info["tokens"] == 4
    assert info["content_type"].startswith("text/event-stream")


def test_a_second_choice_is_refused(hostile):
    msg, _ = refused(hostile, "choices2", timeout_s=5.0)
    assert "the server streamed choice index 1; loadgen asks for one choice (n=1)" in msg


def test_a_reply_without_a_token_is_refused_with_what_came(hostile):
    msg, _ = refused(hostile, "empty", timeout_s=5.0)
    assert "without a generated token" in msg and "usage.completion_tokens 0" in msg
