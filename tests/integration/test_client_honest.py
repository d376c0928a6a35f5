"""The streaming client takes a reply for what arrived (tests/hostile_server.py on 127.0.0.1).

Zero tokens to a request that asked for some is a failure (``empty_reply``), a usage count that
disagrees with the token chunks is kept beside them, a choice other than the one asked for is
never merged into the reply, and SSE as the spec allows it (CR-only line ends, a byte order mark,
``data:`` fields over several lines, comments and ``event:``/``id:`` fields) is read with its
tokens, whichever way the bytes are cut.
"""

from __future__ import annotations

import time

import pytest

from analysis.records import STATUS_ERROR, STATUS_OK
from tests.unit.test_reply_checks import SESSION, ctx

_ids = iter(range(1_000_000))


def send(base: str, behaviour: str, *, max_tokens: int = 4, stream: bool = True, **options):
    """One chat request to ``behaviour``: (its StreamResult, its RequestRecord)."""
    from loadgen.engine.client import SessionConnection
    from loadgen.engine.session import _record
    from targets.adapters.base import ChatRequest
    from targets.adapters.openai import OpenAIChatAdapter

    adapter = OpenAIChatAdapter()
    req = ChatRequest(
        messages=[{"role": "user", "content": "hi"}], max_tokens=max_tokens, session_id="s",
        request_id=f"c-{next(_ids)}", stream=stream,
    )  # fmt: skip
    c = ctx()
    with SessionConnection(f"{base}/{behaviour}", **options) as conn:
        t_sched = time.perf_counter_ns()
        res = conn.stream(adapter.build_request(req), adapter, deadline_s=5.0)
    c.t0_ns = t_sched - 1_000_000
    return res, _record(c, SESSION, 0, max_tokens, req.request_id, t_sched, res)


def test_a_stream_without_a_token_is_an_empty_reply(hostile):
    _, rec = send(hostile, "empty")
    assert rec.status == STATUS_ERROR and rec.error_category == "empty_reply"
    assert rec.error_message == "stream ended after 0 token chunks; usage.completion_tokens 0"
    assert rec.http_status == 200 and rec.output_tokens == 0 and rec.chunks == 0


def test_a_whole_body_without_a_token_is_an_empty_reply(hostile):
    _, rec = send(hostile, "empty-json", stream=False)
    assert rec.error_category == "empty_reply"
    assert rec.error_message == "reply body carried no generated text; usage.completion_tokens 0"


def test_usage_below_the_chunks_is_not_believed(hostile):
    _, rec = send(hostile, "usage-1", max_tokens=16)
    assert rec.status == STATUS_OK and rec.chunks == 16
    assert rec.usage_completion_tokens == 1 and rec.chunk_output_tokens == 16 and rec.output_tokens == 16
    assert rec.tpot_us is not None


def test_usage_above_the_chunks_is_kept_beside_them(hostile):
    _, rec = send(hostile, "usage-48", max_tokens=16)
    assert rec.status == STATUS_OK and rec.chunks == 16
    assert rec.usage_completion_tokens == 48 and rec.chunk_output_tokens == 16 and rec.output_tokens == 48


def test_a_second_choice_is_never_merged_into_the_reply(hostile):
    res, rec = send(hostile, "choices2")
    assert rec.error_category == "bad_chunk"
    assert "the server streamed choice index 1; loadgen asks for one choice (n=1)" in rec.error_message
    assert "c1" not in res.text and len(res.chunk_ns) <= 1


@pytest.mark.parametrize("behaviour", ["cr", "bom", "multiline", "gzip"])
@pytest.mark.parametrize(("block_size", "idle_timeout_s"), [(65536, None), (1, None), (7, 5.0)])
def test_sse_as_the_spec_allows_it_is_read_with_its_tokens(hostile, behaviour, block_size, idle_timeout_s):
    # block_size 1: every byte its own recv, so line ends (a CR and its LF, or a lone CR) are cut
    # apart; an idle timeout reads in the session's greenlet instead of the stream reader.
    res, rec = send(hostile, behaviour, block_size=block_size, idle_timeout_s=idle_timeout_s)
    assert res.ok, (res.error_category, res.error_message)
    assert res.text == " t0 t1 t2 t3" and len(res.chunk_ns) == 4 and res.output_tokens == 4
    assert rec.status == STATUS_OK and rec.output_tokens == rec.chunk_output_tokens == 4
