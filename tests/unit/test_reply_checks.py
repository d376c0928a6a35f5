"""What a reply is taken for, without a server: empty replies, the output-token count when usage
and the chunks disagree, the generator's own network failures, never-sent requests, and OpenAI
choices other than the one loadgen asked for."""

from __future__ import annotations

import errno
import socket

import pytest

from analysis.records import RequestRecord, metric_values
from loadgen.engine import client, http_reply, sse_state
from loadgen.engine.client import SessionConnection, StreamResult
from loadgen.engine.session import InFlight, SessionContext, _record
from targets.adapters.base import BadChunk, ChatRequest, Usage
from targets.adapters.openai import OpenAIChatAdapter, OpenAICompletionsAdapter
from workloads.model import Session

T0 = 1_000_000_000_000
SCHED = T0 + 5_000_000  # 5 ms into the run


def ctx() -> SessionContext:
    return SessionContext(
        run_id="r", worker_id="w", base_url="http://127.0.0.1:9", adapter=OpenAIChatAdapter(), model=None,
        target_label="t", session_header="X-Session-ID", request_timeout_s=5.0, connect_timeout_s=1.0,
        api_key=None, extra_headers={}, t0_ns=T0, on_record=lambda r: None, is_stopping=lambda: False,
        in_flight=InFlight(),
    )  # fmt: skip


SESSION = Session("s", "default", "sys", ())


def record(res: StreamResult, max_tokens: int = 4):
    return _record(ctx(), SESSION, 0, max_tokens, "r-0-0", SCHED, res)


def streamed(chunks: list[int], usage: int | None, *, text: str = "") -> StreamResult:
    t = SCHED + 1_000_000
    res = StreamResult(t_send_ns=t, streamed=True)
    res.chunk_ns = [t + 10_000_000 * (i + 1) for i in range(len(chunks))]
    res.chunk_tokens = list(chunks)
    res.t_first_ns = res.chunk_ns[0] if chunks else None
    res.t_end_ns = t + 10_000_000 * (len(chunks) + 2)
    res.usage = None if usage is None else Usage(5, usage, None)
    res.text = text
    return res


# ---- empty replies --------------------------------------------------------------------------------


def test_a_stream_with_no_token_is_an_empty_reply():
    rec = record(streamed([], 0))
    assert not rec.ok and rec.error_category == "empty_reply"
    assert rec.error_message == "stream ended after 0 token chunks; usage.completion_tokens 0"
    assert rec.output_tokens == 0
    rec = record(streamed([], None))
    assert rec.error_category == "empty_reply"
    assert rec.error_message == "stream ended after 0 token chunks; no usage reported"


def test_a_whole_body_with_no_token_is_an_empty_reply():
    res = StreamResult(t_send_ns=SCHED + 1000, t_end_ns=SCHED + 2_000_000, usage=Usage(5, 0, None))
    rec = record(res)
    assert rec.error_category == "empty_reply"
    assert rec.error_message == "reply body carried no generated text; usage.completion_tokens 0"


def test_no_token_is_no_failure_when_none_was_asked():
    assert record(streamed([], 0), max_tokens=0).ok


def test_a_failure_keeps_its_own_category():
    res = streamed([], None)
    res.error_category, res.error_message = "http_5xx", "HTTP 500: boom"
    assert record(res).error_category == "http_5xx"


# ---- usage against the chunks -----------------------------------------------------------------------


def test_usage_below_the_token_chunks_is_impossible_and_the_chunks_count():
    rec = record(streamed([1] * 16, 1))
    assert rec.ok and rec.output_tokens == 16
    assert rec.usage_completion_tokens == 1 and rec.chunk_output_tokens == 16 and rec.chunks == 16
    assert rec.tpot_us == pytest.approx(10_000)  # (t_last - t_first) / 15
    assert streamed([1] * 16, 1).output_tokens == 16


def test_usage_above_the_token_chunks_wins_and_both_are_kept():
    rec = record(streamed([1] * 16, 48))
    assert rec.ok and rec.output_tokens == 48
    assert rec.usage_completion_tokens == 48 and rec.chunk_output_tokens == 16
    assert streamed([1] * 16, 48).output_tokens == 48


def test_agreeing_counts_and_multi_token_chunks():
    rec = record(streamed([2, 3, 1], 6))
    assert rec.output_tokens == rec.chunk_output_tokens == rec.usage_completion_tokens == 6
    rec = record(streamed([1, 1, 1], None))
    assert rec.output_tokens == rec.chunk_output_tokens == 3 and rec.usage_completion_tokens is None


# ---- the generator's own network, and requests never sent ------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "category"),
    [
        (OSError(errno.ENETUNREACH, "Network is unreachable"), "client_network"),
        (OSError(errno.EHOSTUNREACH, "No route to host"), "client_network"),
        (OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address"), "client_network"),
        (OSError(errno.ENETDOWN, "Network is down"), "client_network"),
        (OSError(errno.EMFILE, "Too many open files"), "client_network"),
        (socket.gaierror(socket.EAI_NONAME, "Name or service not known"), "client_network"),
        (ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"), "connection"),
        (TimeoutError("timed out"), "connection"),
        (ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"), "connection"),
    ],
)
def test_connect_errors_are_told_apart(exc, category):
    assert client.connect_error_category(exc) == category


def _request():
    adapter = OpenAIChatAdapter()
    req = ChatRequest(messages=[{"role": "user", "content": "hi"}], max_tokens=4, session_id="s", request_id="r")
    return adapter.build_request(req), adapter


@pytest.mark.parametrize(
    ("exc", "said"),
    [
        (OSError(errno.ENETUNREACH, "Network is unreachable"), "network is unreachable"),
        (socket.gaierror(socket.EAI_NONAME, "Name or service not known"), "cannot resolve host"),
    ],
)
def test_a_connect_the_generator_cannot_make_is_its_own_failure_and_was_never_sent(monkeypatch, exc, said):
    def fail(*_a, **_k):
        raise exc

    monkeypatch.setattr(client, "_connect", fail)
    prepared, adapter = _request()
    with SessionConnection("http://127.0.0.1:9") as conn:
        res = conn.stream(prepared, adapter, deadline_s=2.0)
    assert res.error_category == "client_network" and said in res.error_message
    assert res.error_message.startswith("cannot connect to 127.0.0.1:9: ")
    assert res.t_send_ns == 0 and not res.sent
    rec = record(res)
    assert rec.error_category == "client_network"
    assert rec.sent is False and rec.t_send_us == rec.t_sched_us  # no send time, not a huge negative one
    assert rec.schedule_lag_us == 0


def test_a_sent_request_says_so():
    rec = record(streamed([1, 1], 2))
    assert rec.sent is True and rec.t_send_us == 6_000 and rec.schedule_lag_us == 1_000
    assert dict(metric_values(rec))["schedule_lag"] == 1_000


# ---- choices other than index 0 -----------------------------------------------------------------------------


def test_chat_chunk_of_another_choice_is_bad_chunk():
    parser = OpenAIChatAdapter().new_stream()
    ev = parser.parse_line(b'data: {"choices":[{"index":0,"delta":{"content":" a"}}]}')
    assert ev.tokens == 1 and ev.text == " a"
    with pytest.raises(BadChunk, match=r"the server streamed choice index 1; loadgen asks for one choice \(n=1\)"):
        parser.parse_line(b'data: {"choices":[{"index":1,"delta":{"content":" b"}}]}')
    with pytest.raises(BadChunk, match="choice index 1"):  # two choices in one chunk
        OpenAIChatAdapter().parse_line(
            b'data: {"choices":[{"index":0,"delta":{"content":" a"}},{"index":1,"delta":{"content":" b"}}]}'
        )


def test_completions_chunk_of_another_choice_is_bad_chunk():
    parser = OpenAICompletionsAdapter().new_stream()
    assert parser.parse_line(b'data: {"choices":[{"index":0,"text":" a"}]}').tokens == 1
    with pytest.raises(BadChunk, match="the server streamed choice index 2"):
        parser.parse_line(b'data: {"choices":[{"index":2,"text":" b"}]}')


def test_a_whole_body_with_two_choices_is_bad_chunk():
    body = (
        b'{"choices":[{"index":0,"message":{"content":" a"}},{"index":1,"message":{"content":" b"}}],'
        b'"usage":{"completion_tokens":2}}'
    )
    with pytest.raises(BadChunk, match=r"the server sent choice index 1; loadgen asks for one choice \(n=1\)"):
        OpenAIChatAdapter().parse_response(body)
    with pytest.raises(BadChunk, match="choice index 1"):
        OpenAICompletionsAdapter().parse_response(b'{"choices":[{"index":0,"text":" a"},{"index":1,"text":" b"}]}')


# ---- SSE as the spec allows it: line ends, a byte order mark, data over several lines --------------------


def _lines_of(pieces: list[bytes]) -> list[list[bytes]]:
    """What ``take_lines`` returns after each piece of a chunked SSE body is fed to it."""
    resp = http_reply.StampedResponse(None, 65536)
    resp.feed(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
    out = []
    for p in pieces:
        resp.feed_body(b"%x\r\n%s\r\n" % (len(p), p) if p else b"0\r\n\r\n")
        while (lines := resp.take_lines()) is not None:
            out.append(lines)
            if not lines:
                break
    return out


def test_lf_and_crlf_split_as_before():
    assert _lines_of([b"data: a\n\ndata: b\n", b"\n", b""]) == [[b"data: a", b"", b"data: b"], [b""], []]
    assert _lines_of([b"data: a\r\n\r", b"\n", b""]) == [[b"data: a\r"], [b"\r"], []]


def test_a_lone_cr_ends_lines_and_a_cr_cut_from_its_lf_is_one_line_end():
    assert _lines_of([b"data: a\r\rdata: b\r\r", b""]) == [[b"data: a", b"", b"data: b"], [b""], []]
    # A CR as the last byte so far waits for the next: CR LF across two reads is one line end.
    got = _lines_of([b"data: a\rdata: b\r", b"\ndata: c\r", b"\r", b""])
    assert [ln for block in got for ln in block] == [b"data: a", b"data: b", b"data: c", b""]


def test_a_byte_order_mark_at_the_start_is_dropped():
    assert _lines_of([b"\xef\xbb\xbfdata: a\n\n", b"\xef\xbb\xbfdata: b\n", b""])[:2] == [
        [b"data: a", b""],
        [b"\xef\xbb\xbfdata: b"],  # only at the start of the stream
    ]


def _state():
    res = StreamResult()
    return sse_state.StreamState(OpenAIChatAdapter().new_stream().parse_line, res), res


def test_data_over_several_lines_is_one_event_stamped_when_its_last_line_came():
    st, res = _state()
    assert not st.take([b'data: {"choices":', b": a comment", b"event: message"], 100)
    assert not st.take([b'data: [{"delta":{"content":" a"}}]}'], 200)
    assert res.chunk_ns == []  # not before its blank line
    assert not st.take([b"", b'data: {"choices":[{"delta":{"content":" b"}}]}', b""], 300)
    assert res.chunk_ns == [200, 300] and st.parts == [" a", " b"]
    assert st.take([b"data: [DONE]"], 400)


def test_a_broken_data_line_still_fails_at_the_end_of_its_event():
    st, _ = _state()
    assert not st.take([b'data: {"choices": [{"delta": '], 100)
    with pytest.raises(BadChunk, match="not JSON"):
        st.take([b""], 100)
    st, _ = _state()
    st.take([b'data: {"choices": [{"delta": ', b"data: [DONE]"], 100)
    with pytest.raises(BadChunk, match="not JSON"):
        st.dispatch()  # the body ended: what was kept is parsed, and fails
    with pytest.raises(BadChunk, match="not an SSE line"):
        _state()[0].take([b"garbage"], 100)


def test_the_summary_counts_replies_whose_usage_disagrees_with_their_chunks() -> None:
    from analysis.usage_check import usage_check, usage_note

    def rec(usage: int | None, chunks: int | None, status: str = "ok") -> RequestRecord:
        return RequestRecord(
            "r", "s", 0, 0, "first", "default", "t", "w", status, 0, 0,
            usage_completion_tokens=usage, chunk_output_tokens=chunks,
        )  # fmt: skip

    check = usage_check([rec(1, 16), rec(48, 16), rec(5, 5), rec(None, 7), rec(3, 9, "error")])
    assert check is not None
    assert (check["requests"], check["disagree"]) == (3, 2)
    assert (check["usage_above_chunks"], check["usage_below_chunks"]) == (1, 1)
    assert (check["usage_minus_chunks_min"], check["usage_minus_chunks_max"]) == (-15, 32)
    assert usage_note(check).startswith("2 of 3 replies: usage.completion_tokens disagreed")
    assert usage_check([rec(None, 4)]) is None and usage_note(usage_check([rec(4, 4)])) is None
