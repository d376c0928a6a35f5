"""The compiled chat chunk path (loadgen/engine/_chat.c) against the Python path it stands for:
the same lines, in the same reads, leave the same stream state (chunk times and tokens, text,
reasoning, first answer token, end, error, the stream's and the worker's counts) and raise the
same errors through ``_chat.ChatTaker.take`` as through ``StreamState.take`` with the OpenAI chat
adapter's parser, for lines generated in every shape a chunk's fields can take and for hostile
ones. Which lines the C side takes itself is checked too, so the test cannot pass by handing
everything to Python.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.engine import sse_state
from loadgen.engine.health import ChunkCounts
from loadgen.engine.outcome import StreamResult
from loadgen.engine.sse_state import StreamState
from targets.adapters.llamacpp import LlamaServerAdapter
from targets.adapters.openai import OpenAIChatAdapter, OpenAICompletionsAdapter

_chat = sse_state._chat
pytestmark = pytest.mark.skipif(_chat is None, reason="the compiled chat path is not built (make setup builds it)")


CHAT, COMPLETIONS, LLAMA = "openai-chat", "openai-completions", "llama-server"
# (adapter, keep reasoning in the text): both chat settings, completions and llama-server's native
# stream (no reasoning field)
FLAVOURS = ((CHAT, False), (CHAT, True), (COMPLETIONS, False), (LLAMA, False))


def _state(keep_reasoning: bool, kind: str = CHAT) -> tuple[StreamState, object]:
    if kind == CHAT:
        stream = OpenAIChatAdapter(reasoning_in_history=keep_reasoning).new_stream()
    elif kind == COMPLETIONS:
        stream = OpenAICompletionsAdapter().new_stream()
    else:
        stream = LlamaServerAdapter().new_stream()
    return StreamState(stream.parse_line, StreamResult(), ChunkCounts()), stream


def _snapshot(s: StreamState, stream) -> tuple:
    return (
        list(s.chunk_ns), list(s.chunk_tokens), "".join(s.parts), s.reasoning, s.output_ns, s.done,
        None if s.error is None else (s.error.error, s.error.error_code), s.usage, s.timings, s.pending,
        s.counts.token_chunks, s.counts.coalesced, getattr(stream, "counted", None), getattr(stream, "start", None),
    )  # fmt: skip


def _run(reads: list[list[bytes]], keep_reasoning: bool, compiled: bool, kind: str = CHAT) -> list:
    s, stream = _state(keep_reasoning, kind)
    return _take_reads(reads, s, stream, _chat.ChatTaker(s, stream, kind).take if compiled else s.take)


def _take_reads(reads: list[list[bytes]], s: StreamState, stream, take) -> list:
    """Each read's lines through ``take``, and the state after each (up to the first error)."""
    out = []
    for i, lines in enumerate(reads):
        t = 1_000 + 10 * (i // 2)  # every other read shares a stamp: coalesced reads counted too
        try:
            out.append(("ok", take(list(lines), t), _snapshot(s, stream)))
        except Exception as e:  # the client abandons the stream at an error: so does the comparison
            out.append(("raised", type(e), str(e), _snapshot(s, stream)))
            break
    return out


def _same(reads: list[list[bytes]]) -> None:
    for kind, keep in FLAVOURS:
        assert _run(reads, keep, True, kind) == _run(reads, keep, False, kind), (kind, keep, reads)


TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=6) | st.sampled_from(
    ["", "a", "é", "\n", '"', "\\", "/", "\u2028", "\U0001f600", "\x00", "\x7f", "tab\there"]
)
ODD = st.sampled_from([None, 0, 1, -0.0, 0.0, True, False, "", "x", [], [1], {}, {"a": 1}, 10**20, 1e300])
TOOL_CALLS = st.sampled_from([None, [], [{"index": 0, "function": {"arguments": "{\"a\""}}], {}, 0, "x", False])


@st.composite
def _delta(draw) -> object:
    if draw(st.integers(0, 9)) == 0:
        return draw(ODD)
    d: dict = {}
    for key, values in (
        ("role", st.sampled_from(["assistant", None])),
        ("content", TEXT | ODD),
        ("reasoning_content", TEXT | ODD),
        ("reasoning", TEXT | ODD),
        ("tool_calls", TOOL_CALLS),
    ):
        if draw(st.booleans()):
            d[key] = draw(values)
    return d


@st.composite
def _chunk(draw) -> dict:
    obj: dict = {"id": draw(st.sampled_from(["chatcmpl-1", "x\u00e9"])), "object": draw(st.sampled_from(["chat.completion.chunk", "error", 5]))}
    if draw(st.integers(0, 9)) == 0:
        obj["choices"] = draw(ODD)
    elif draw(st.integers(0, 9)):
        c0: dict = {}
        if draw(st.booleans()):
            c0["index"] = draw(st.sampled_from([0, 1, None, 0.0, "0", True, -1]))
        if draw(st.integers(0, 5)):
            c0["delta"] = draw(_delta())
        if draw(st.integers(0, 2)) == 0:
            c0["text"] = draw(TEXT | ODD)
        if draw(st.booleans()):
            c0["finish_reason"] = draw(st.sampled_from([None, "stop", "length"]))
        obj["choices"] = [c0] + ([{"index": draw(st.sampled_from([0, 1])), "delta": {"content": "z"}}] if draw(st.integers(0, 7)) == 0 else [])
    if draw(st.integers(0, 5)) == 0:
        obj["usage"] = draw(st.sampled_from([None, {"prompt_tokens": 3, "completion_tokens": 7}, {"completion_tokens": 1}, 3]))
    if draw(st.integers(0, 9)) == 0:
        obj["timings"] = draw(st.sampled_from([None, {"prompt_n": 2}, 4]))
    if draw(st.integers(0, 14)) == 0:
        obj["error"] = draw(st.sampled_from([None, {"message": "boom", "code": 503}, "text"]))
    if draw(st.integers(0, 9)) == 0:
        obj["created"] = draw(st.sampled_from([1700000000, 10**17, -0.5, 1.5e10, 2e-300]))
    return obj


def _compact(obj: dict) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()  # raw UTF-8, as servers send


def _encode(obj: dict, how: int) -> bytes:
    if how == 0:
        return _compact(obj)
    if how == 1:
        return json.dumps(obj, ensure_ascii=True).encode()  # \u escapes: the Python side's
    if how == 2:
        return json.dumps(obj, ensure_ascii=False, indent=None, separators=(" , ", " : ")).encode()
    raw = _compact(obj)
    if how == 3 and raw.startswith(b'{"id"'):  # a repeated key: orjson keeps the last
        return b'{"choices":[{"delta":{"content":"first"}}],' + raw[1:]
    return raw[: max(1, len(raw) - 1 - how)]  # cut short: not JSON


PLAIN_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\u0000"), min_size=1, max_size=5)


@st.composite
def _plain_chunk(draw) -> dict:
    """A chunk as servers send them: the shapes the compiled path takes itself."""
    delta: dict = {}
    if draw(st.booleans()):
        delta["role"] = "assistant"
    which = draw(st.integers(0, 5))
    if which in (0, 1):
        delta["content"] = draw(PLAIN_TEXT)
    elif which == 2:
        delta[draw(st.sampled_from(["reasoning_content", "reasoning"]))] = draw(PLAIN_TEXT)
    elif which == 3:
        delta["tool_calls"] = [{"index": 0, "function": {"arguments": draw(PLAIN_TEXT)}}]
    elif which == 4:  # several at once
        for key in draw(st.sets(st.sampled_from(["content", "reasoning_content", "reasoning", "tool_calls"]))):
            delta[key] = [{"index": 0}] if key == "tool_calls" else draw(st.sampled_from(["", None]) | PLAIN_TEXT)
    c0: dict = {"delta": delta}
    if draw(st.booleans()):  # a completions chunk's text (the chat adapter reads only the delta)
        c0["text"] = draw(st.sampled_from(["", None]) | PLAIN_TEXT)
    if draw(st.booleans()):
        c0["index"] = draw(st.sampled_from([0, None]))
    if draw(st.booleans()):
        c0["finish_reason"] = draw(st.sampled_from([None, "stop"]))
        c0["logprobs"] = None
    obj = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1700000000, "model": "m", "choices": [c0]}
    if draw(st.booleans()):
        obj["usage"] = None
    return obj


@st.composite
def _llama_chunk(draw) -> dict:
    """llama-server's native /completion chunks: content, its token ids, stop (and its end's fields)."""
    obj: dict = {"content": draw(PLAIN_TEXT | st.sampled_from(["", None]) | (TEXT | ODD if draw(st.integers(0, 4)) == 0 else PLAIN_TEXT)),
                 "stop": draw(st.sampled_from([False, False, False, True, None, 0]))}  # fmt: skip
    if draw(st.booleans()):
        obj["tokens"] = draw(st.lists(st.integers(0, 50000), max_size=4) | st.sampled_from([None, 5, "x", {}]))
    if draw(st.booleans()):
        obj["id_slot"] = 0
    if obj["stop"]:
        obj.update(tokens_predicted=7, tokens_evaluated=30, timings={"prompt_n": 30, "cache_n": 4, "predicted_n": 7})
    if draw(st.integers(0, 14)) == 0:
        obj["error"] = {"code": 500, "message": "x"}
    return obj


@st.composite
def _line(draw) -> bytes:
    if draw(st.integers(0, 3)) == 0:
        body = _encode(draw(_llama_chunk()), draw(st.sampled_from([0, 0, 1, 2, 3])))
        return draw(st.sampled_from([b"data: ", b"data: ", b"data:", b"error: "])) + body + draw(st.sampled_from([b"", b"\r"]))
    if draw(st.booleans()):
        body = _encode(draw(_plain_chunk()), draw(st.sampled_from([0, 0, 0, 1, 2, 3])))
        return b"data: " + body + draw(st.sampled_from([b"", b"\r"]))
    kind = draw(st.integers(0, 19))
    if kind == 0:
        return draw(st.sampled_from([b"", b"\r", b"data: [DONE]", b"data: [DONE]\r", b"data:[DONE]", b": keep-alive", b"event: message", b"data:", b"data: ", b"data: [DONE] x"]))
    if kind == 1:
        return draw(st.binary(max_size=40))
    if kind == 2:
        return b"data: " + draw(st.sampled_from([b"{", b"{}", b"{} x", b'{"a":01}', b'{"a":1e999}', b'{"a":NaN}', b'{"a":"\xed\xa0\x80"}', b'{"a":"\xc3"}', b'{"a":"\\ud800"}', b'{"a":"\\x"}', b'[1]', b'{"choices":[{"delta":{"content":"\x01"}}]}', b'{"choices":[{"delta":{"content":"ok"}}]}\r', b'{"choices":[{"delta":{"content":"a"}}]} \t',
                                           # values before the fields read: skipped over, not re-read
                                           b'{"created":1e5,"choices":[{"delta":{"content":"a"}}]}', b'{"n":-1.5E+2,"x":true,"y":false,"choices":[{"delta":{"content":"b"}}]}',
                                           b'{"id":"q\\"}{[","s":"\\\\","choices":[{"logprobs":{"a":[1,{"b":"]"}]},"delta":{"content":"c"}}]}',
                                           b'{"a":[],"b":{},"c":[ ],"d":{ },"choices":[{"delta":{"content":"d"}}]}']))
    body = _encode(draw(_chunk()), draw(st.integers(0, 5)))
    prefix = draw(st.sampled_from([b"data: ", b"data: ", b"data: ", b"data:", b"data:  "]))
    return prefix + body + draw(st.sampled_from([b"", b"", b"\r", b" "]))


@settings(max_examples=600, deadline=None)
@given(st.lists(st.lists(_line(), max_size=5), min_size=1, max_size=8))
def test_the_compiled_chat_path_leaves_the_python_paths_state(reads: list[list[bytes]]) -> None:
    _same(reads)


def test_a_typical_stream_is_taken_in_c_and_equals_the_python_path() -> None:
    lines = [
        b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}',
        b"",
        b'data: {"id":"c","choices":[{"index":0,"delta":{"reasoning_content":"think"},"logprobs":null}]}',
        b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"Hel"}}]}',
        b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"lo \\"w\\"\\n"}}],"usage":null}',
        b'data: {"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}}]}',
        b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":4}}',
        b"data: [DONE]",
    ]
    reads = [[x] for x in lines]
    _same(reads)
    # Every line but the usage chunk's is the C side's own (None: handed to Python).
    said = [_chat.read_line(x) for x in lines]
    assert said == ["nothing", "nothing", (1, 1, None), (1, 0, "Hel"), (1, 0, 'lo "w"\n'), (1, 0, None), None, "done"]
    s, stream = _state(False)
    take = _chat.ChatTaker(s, stream).take
    assert [take([x], 5) for x in lines] == [False] * 7 + [True]
    assert s.chunk_tokens == [1, 1, 1, 1]
    assert "".join(s.parts) == 'Hello "w"\n' and s.reasoning == 1 and s.done


def test_the_fields_are_found_at_their_own_level_and_a_repeat_or_an_escaped_key_goes_to_python() -> None:
    # One scan validates the line and finds the fields read (top level, the first choice, its
    # delta): a field of the same name deeper down is not one of them, and a repeated field or a
    # key with an escape at any of those levels is the Python path's (orjson keeps the last).
    taken = {
        b'data: {"x":{"choices":[{"delta":{"content":"no"}}]},"choices":[{"delta":{"content":"a"}}]}': (1, 0, "a"),
        b'data: {"choices":[{"x":{"delta":{"content":"no"}},"delta":{"content":"b"}}]}': (1, 0, "b"),
        b'data: {"choices":[{"delta":{"x":{"content":"no"},"content":"c"}}]}': (1, 0, "c"),
        b'data: {"choices":[{"delta":{"x":{"content":"no"}}}]}': "nothing",
        b'data: {"choices":[{"logprobs":{"content":[{"token":"x"}]},"delta":{"content":"d"}}],"usage":null}': (1, 0, "d"),
        b'data: {"choi\\ces":1,"choices":[{"delta":{"content":"e"}}]}': None,  # an escaped key, top level
        b'data: {"choices":[{"del\\ta":1,"delta":{"content":"f"}}]}': None,  # in the choice
        b'data: {"choices":[{"delta":{"con\\tent":1,"content":"g"}}]}': None,  # in the delta
        b'data: {"choices":[{"delta":{"content":"a"},"delta":{"content":"b"}}]}': None,
        b'data: {"choices":[{"delta":{"content":"a","content":"b"}}]}': None,
        b'data: {"choices":[{"index":0,"index":0,"delta":{"content":"a"}}]}': None,
        b'data: {"object":"x","object":"y","choices":[{"delta":{"content":"a"}}]}': None,
        b'data: {"choices":[{"delta":{"content":"a"}},{"delta":{"content":"b"}}]}': None,
        b'data: {"choices":[{"delta":{"content":"a"}},1]}': None,
        b'data: {"choices":[1,{"delta":{"content":"a"}}]}': None,
        b'data: {"choices":[[{"delta":{"content":"a"}}]]}': None,
        b'data: {"choices":{"delta":{"content":"a"}}}': None,
        b'data: {"choices":[{"delta":[{"content":"a"}]}]}': None,
    }
    for line, said in taken.items():
        assert _chat.read_line(line) == said, line
    lines = list(taken)
    _same([lines[i : i + 3] for i in range(0, len(lines), 3)])
    _same([[x] for x in lines])


def test_the_python_path_takes_over_mid_read_and_keeps_the_order_of_the_text() -> None:
    a = b'data: {"choices":[{"delta":{"content":"a"}}]}'
    escaped = b'data: {"choices":[{"delta":{"content":"\\u00e9"}}]}'  # \u: Python's
    b = b'data: {"choices":[{"delta":{"content":"b"}}]}'
    assert _chat.read_line(escaped) is None
    _same([[a, escaped, b], [a]])
    s, stream = _state(False)
    _chat.ChatTaker(s, stream).take([a, escaped, b], 9)
    assert "".join(s.parts) == "a\u00e9b" and s.chunk_ns == [9, 9, 9] and s.counts.coalesced == 2


def test_the_worker_uses_it_only_for_the_chat_adapters_own_stream() -> None:
    s, _stream = _state(False)
    take = sse_state.stream_take(s)
    assert getattr(take, "__self__", None).__class__.__name__ == ("ChatTaker" if sse_state.READER == "compiled" else "StreamState")

    class Custom(type(_stream)):
        __slots__ = ()

        def parse_line(self, line):  # a subclass with its own parsing keeps the Python path
            return super().parse_line(line)

    custom = Custom()
    s2 = StreamState(custom.parse_line, StreamResult(), None)
    assert sse_state.stream_take(s2) == s2.take


def test_a_completions_stream_is_taken_in_c_too() -> None:
    lines = [
        b'data: {"id":"c","object":"text_completion","choices":[{"index":0,"text":"Hel","logprobs":null}]}',
        b'data: {"id":"c","choices":[{"index":0,"text":"","finish_reason":"stop"}]}',
        b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}',
        b"data: [DONE]",
    ]
    _same([[x] for x in lines])
    assert [_chat.read_line(x, False, COMPLETIONS) for x in lines] == [(1, 0, "Hel"), "nothing", None, "done"]
    with pytest.raises(ValueError, match="no compiled path"):
        _chat.ChatTaker(*_state(False), "sglang-native")


class _Head:
    """A socket that returns a reply's head, then nothing more (the body comes through consume)."""

    def __init__(self, head: bytes) -> None:
        self.head = head

    def recv(self, _n: int) -> bytes:
        out, self.head = self.head, b""
        return out


def _consume_run(pieces: list[bytes], chunked: bool, compiled_consume: bool) -> list:
    from loadgen.engine.client import _consume_of
    from loadgen.engine.http_reply import StampedResponse

    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
    head += b"transfer-encoding: chunked\r\n\r\n" if chunked else b"connection: close\r\n\r\n"
    resp = StampedResponse(_Head(head), 65536, False, 1 << 16, True)
    resp.read_headers()
    assert resp.compiled_body is not None
    s, stream = _state(False)
    take = _chat.ChatTaker(s, stream).take if compiled_consume else s.take
    delays: list[int] = []
    consume = _consume_of(resp, s, take, delays)
    assert (getattr(consume, "__self__", None) is not None) == compiled_consume
    out = []
    for i, data in enumerate(pieces):
        t = 5_000 + 7 * (i // 2)
        try:
            out.append(("ok", consume(data, t), _snapshot(s, stream), resp.t_recv_ns, resp.message_complete, len(delays)))
        except Exception as e:
            out.append(("raised", type(e), str(e), _snapshot(s, stream)))
            break
    return out


def _framed(lines: list[bytes], cuts: list[int], chunked: bool) -> list[bytes]:
    body = b"".join(x + b"\n" for x in lines)
    if chunked:
        body = b"".join(b"%x\r\n%s\r\n" % (len(x) + 1, x + b"\n") for x in lines) + b"0\r\n\r\n"
    points = sorted({c % (len(body) + 1) for c in cuts})
    pieces = [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True) if b > a]
    return [*pieces, b""]  # the peer closes at the end


@settings(max_examples=200, deadline=None)
@given(st.lists(_line(), min_size=1, max_size=8), st.lists(st.integers(0, 4000), max_size=6), st.booleans())
def test_the_compiled_consume_reads_a_reply_as_the_python_one(lines: list[bytes], cuts: list[int], chunked: bool) -> None:
    lines = [x.replace(b"\n", b" ").replace(b"\r", b" ") for x in lines]  # one line each
    pieces = _framed(lines, cuts, chunked)
    assert _consume_run(pieces, chunked, True) == _consume_run(pieces, chunked, False)


def test_a_llama_server_stream_is_taken_in_c_too() -> None:
    lines = [
        b'data: {"index":0,"content":"Hel","tokens":[9906],"stop":false,"id_slot":0}',
        b'data: {"index":0,"content":"lo!","tokens":[385,0],"stop":false,"id_slot":0}',
        b'data: {"index":0,"content":"","tokens":[],"stop":false}',
        b'data: {"index":0,"content":"","stop":true,"tokens_predicted":3,"tokens_evaluated":9,"timings":{"prompt_n":9,"cache_n":0}}',
    ]
    _same([[x] for x in lines])
    assert [_chat.read_line(x, False, LLAMA) for x in lines] == [(1, 0, "Hel"), (2, 0, "lo!"), "nothing", None]
    assert _chat.read_line(b"data: [DONE]", False, LLAMA) is None  # not llama-server's: the Python path says so
    s, stream = _state(False, LLAMA)
    take = _chat.ChatTaker(s, stream, LLAMA).take
    assert [take([x], 3) for x in lines] == [False, False, False, True]
    assert s.chunk_tokens == [1, 2] and "".join(s.parts) == "Hello!" and s.done


@pytest.mark.parametrize("line", [
    b'data: {"created":1e5,"choices":[{"delta":{"content":"a"}}]}',
    b'data: {"n":-1.5E+2,"x":true,"y":false,"z":null,"choices":[{"delta":{"content":"b"}}]}',
    b'data: {"id":"q\\"}{[","s":"\\\\","choices":[{"logprobs":{"a":[1,{"b":"]"}]},"delta":{"content":"c"}}]}',
    b'data: { "a" : [ ] , "b" : { } ,"choices" : [ { "delta" : { "content" : "d" } } ] }',
])  # fmt: skip
def test_the_values_before_the_fields_it_reads_are_skipped_over_whatever_they_hold(line: bytes) -> None:
    """The fields a chunk is read by come after values of every kind; the C side skips over
    those (already validated) by their brackets and quotes, and must land on the next key."""
    said = _chat.read_line(line)
    assert said == (1, 0, line.split(b'"content"')[1].split(b'"')[1].decode())
    _same([[line]])
