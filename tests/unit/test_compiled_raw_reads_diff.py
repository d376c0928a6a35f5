"""The compiled reader's raw path (``_chat.ChatTaker.raw``: the poller hands each read's bytes to
the taker in C, which de-frames, splits and takes the lines and keeps what they said until
``flush``) against the all-Python path it stands for: the Python body parser, ``StreamState.take``
and the adapter's own parser. For every adapter with a compiled path, the same reply body, framed
chunked or close-delimited and cut into reads anywhere, must give the same answer per read (ended
or not, or the same error) and, once flushed, the same stream state, reply stamp and completeness
and receive delays. Flushing after every read and only at the end must agree too: the state the
session sees cannot depend on when the taker wrote it.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.engine import sse_state
from loadgen.engine.client import _consume_of
from loadgen.engine.health import ChunkCounts, RecvDelays
from loadgen.engine.http_reply import StampedResponse
from loadgen.engine.outcome import StreamResult
from loadgen.engine.sse_state import StreamState
from targets.adapters.anthropic import AnthropicMessagesAdapter
from targets.adapters.base import Usage
from targets.adapters.llamacpp import LlamaServerAdapter
from targets.adapters.openai import OpenAIChatAdapter, OpenAICompletionsAdapter
from targets.adapters.responses import OpenAIResponsesAdapter, _Link, _ResponsesStream
from targets.adapters.sglang import SGLangAdapter

from . import test_compiled_agent_apis_diff as agent_apis
from . import test_compiled_chat_diff as chat
from . import test_compiled_sglang_diff as sglang

_chat = sse_state._chat
pytestmark = pytest.mark.skipif(
    _chat is None or not _chat.HAS_READER_API, reason="the compiled reader is not built (make setup builds it)"
)

STREAMS = {
    "openai-chat": lambda: OpenAIChatAdapter().new_stream(),
    "openai-chat-reasoning": lambda: OpenAIChatAdapter(reasoning_in_history=True).new_stream(),
    "openai-completions": lambda: OpenAICompletionsAdapter().new_stream(),
    "llama-server": lambda: LlamaServerAdapter().new_stream(),
    "anthropic-messages": lambda: AnthropicMessagesAdapter().new_stream(),
    "openai-responses": lambda: OpenAIResponsesAdapter().new_stream(),
    "openai-responses-chained": lambda: _ResponsesStream(_Link(n_messages=2, digest=b"d")),
    "sglang": lambda: SGLangAdapter().new_stream(),
    "sglang-incremental": lambda: SGLangAdapter(incremental_text=True).new_stream(),
}


def _snapshot(s: StreamState, stream) -> tuple:
    return (
        *chat._snapshot(s, stream), getattr(stream, "seen_chars", None), getattr(stream, "seen_tokens", None),
        getattr(stream, "reply_id", None),
    )  # fmt: skip


def _reply(chunked: bool, compiled: bool) -> StampedResponse:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
    head += b"transfer-encoding: chunked\r\n\r\n" if chunked else b"connection: close\r\n\r\n"
    resp = StampedResponse(chat._Head(head), 65536, False, 1 << 16, compiled)
    resp.read_headers()
    assert (resp.compiled_body is not None) == compiled
    return resp


def _run(kind: str, pieces: list[bytes], chunked: bool, path: str) -> list:
    """The reads through one path: ``python`` (the Python body parser and ``StreamState.take``),
    ``raw`` (flushed after each read) or ``raw-end`` (flushed once, after the last read or the
    error, as client._follow does)."""
    stream = STREAMS[kind]()
    s = StreamState(stream.parse_line, StreamResult(), ChunkCounts())
    resp = _reply(chunked, compiled=path != "python")
    delays = RecvDelays()
    if path == "python":
        consume = _consume_of(resp, s, s.take, delays)
        flush = None
    else:
        mode = kind.removesuffix("-reasoning").removesuffix("-incremental").removesuffix("-chained")
        taker = _chat.ChatTaker(s, stream, mode, Usage) if mode == "sglang" else _chat.ChatTaker(s, stream, mode)
        taker.bind(resp, resp.compiled_body, delays)
        taker.raw()  # what the poller is given: it must be available for a bound taker

        def consume(data: bytes, t: int) -> bool:
            return taker.consume_raw(data, t)

        flush = taker.flush
    out = []
    for i, data in enumerate(pieces):
        t = 5_000 + 7 * (i // 2)  # two reads share each stamp: the coalesced count
        try:
            ended = consume(data, t)
        except Exception as e:
            if flush is not None:
                flush()
            out.append(("raised", type(e), str(e), _snapshot(s, stream)))
            break
        if path == "raw":
            flush()
        if path != "raw-end" or ended or i == len(pieces) - 1:
            if path == "raw-end":
                flush()
            out.append(("ok", ended, _snapshot(s, stream), resp.t_recv_ns, resp.message_complete, delays.pending()))
        else:
            out.append(("ok", ended))
        if ended:
            break
    return out


def _framed(lines: list[bytes], cuts: list[int], chunked: bool, eol: bytes) -> list[bytes]:
    events = [x + eol for x in lines]
    body = b"".join(events)
    if chunked:
        body = b"".join(b"%x\r\n%s\r\n" % (len(x), x) for x in events if x) + b"0\r\n\r\n"
    points = sorted({c % (len(body) + 1) for c in cuts})
    pieces = [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True) if b > a]
    return [*pieces, b""]  # the peer closes at the end


def _same(kind: str, lines: list[bytes], cuts: list[int], chunked: bool, eol: bytes = b"\n") -> None:
    lines = [x.replace(b"\n", b" ").replace(b"\r", b" ") for x in lines]  # one line each
    pieces = _framed(lines, cuts, chunked, eol)
    python = _run(kind, pieces, chunked, "python")
    raw = _run(kind, pieces, chunked, "raw")
    assert raw == python, (kind, pieces)
    end = _run(kind, pieces, chunked, "raw-end")
    assert [x[:2] for x in end] == [x[:2] for x in python]
    assert end[-1] == python[-1]


CUTS = st.lists(st.integers(0, 6000), max_size=8)
EOL = st.sampled_from([b"\n", b"\n", b"\r\n", b"\r"])


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["openai-chat", "openai-chat-reasoning", "openai-completions", "llama-server"]),
       st.lists(chat._line(), min_size=1, max_size=10), CUTS, st.booleans(), EOL)  # fmt: skip
def test_chat_completions_and_llama_streams_read_raw_equal_the_python_path(kind, lines, cuts, chunked, eol) -> None:
    _same(kind, lines, cuts, chunked, eol)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["sglang", "sglang-incremental"]), sglang._events(), CUTS, st.booleans(), EOL)
def test_sglang_streams_read_raw_equal_the_python_path(kind, lines, cuts, chunked, eol) -> None:
    _same(kind, lines, cuts, chunked, eol)


@settings(max_examples=200, deadline=None)
@given(st.data(), st.sampled_from([agent_apis.MESSAGES, agent_apis.RESPONSES, "openai-responses-chained"]), CUTS,
       st.booleans(), EOL)  # fmt: skip
def test_messages_and_responses_streams_read_raw_equal_the_python_path(data, kind, cuts, chunked, eol) -> None:
    lines = data.draw(st.lists(agent_apis._line(kind.removesuffix("-chained")), min_size=1, max_size=10))
    _same(kind, lines, cuts, chunked, eol)


TYPICAL = [
    b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}',
    b"",
    *[b'data: {"id":"c","choices":[{"index":0,"delta":{"content":" tok"},"finish_reason":null}]}', b""] * 5,
    b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"\\u00e9"}}]}',  # \u: Python's
    b"",
    b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"!"}}]}',
    b"",
    b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":7}}',
    b"",
    b"data: [DONE]",
    b"",
]


@pytest.mark.parametrize("chunked", [True, False])
def test_a_typical_stream_read_raw_one_byte_at_a_time_and_whole(chunked: bool) -> None:
    body = b"".join(x + b"\n" for x in TYPICAL)
    for cuts in (list(range(1, len(body) + 40)), [], [len(body) // 2]):
        _same("openai-chat", TYPICAL, cuts, chunked)
    pieces = _framed(TYPICAL, [], chunked, b"\n")
    out = _run("openai-chat", pieces, chunked, "raw-end")
    snap = out[-1][2]
    assert out[-1][1] is True and snap[0] == [5_000] * 7 and snap[1] == [1] * 7
    assert snap[2] == " tok" * 5 + "é!" and snap[5] is True  # the text, and the end marker seen


def test_raw_reads_give_their_delays_to_the_health_as_int64_and_it_takes_them_all() -> None:
    stream = STREAMS["openai-chat"]()
    s = StreamState(stream.parse_line, StreamResult(), ChunkCounts())
    resp = _reply(True, compiled=True)
    t_head = resp.t_recv_ns
    delays = RecvDelays()
    delays.append(123)  # a value another path appended
    taker = _chat.ChatTaker(s, stream, "openai-chat")
    taker.bind(resp, resp.compiled_body, delays)
    line = b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
    for t in (1, 2, 3):
        assert taker.consume_raw(b"%x\r\n%s\r\n" % (len(line), line), t) is False
    assert delays == [123] and len(delays.raw) == 24 and delays.pending() == 4
    taken = delays.take()
    assert taken.dtype.name == "int64" and taken.size == 4 and taken[0] == 123 and (taken[1:] > 0).all()
    assert delays.pending() == 0 and delays == [] and len(delays.raw) == 0
    assert s.chunk_ns == [] and resp.t_recv_ns == t_head  # nothing on the state before the flush
    taker.flush()
    assert s.chunk_ns == [1, 2, 3] and "".join(s.parts) == "aaa" and resp.t_recv_ns == 3
    assert s.counts.token_chunks == 3 and stream.counted == 3 and s.output_ns == 1


def test_a_taker_not_bound_to_a_compiled_body_reader_has_no_raw_path() -> None:
    stream = STREAMS["openai-chat"]()
    s = StreamState(stream.parse_line, StreamResult(), ChunkCounts())
    taker = _chat.ChatTaker(s, stream, "openai-chat")
    with pytest.raises(TypeError, match="bind"):
        taker.raw()
    with pytest.raises(TypeError, match="bind"):
        taker.consume_raw(b"x", 1)

