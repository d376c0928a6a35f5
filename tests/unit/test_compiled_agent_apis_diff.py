"""The compiled chunk path for the agents' APIs (loadgen/engine/_chat.c: read_messages and
read_responses) against the Python adapters it stands for: the same lines, in the same reads,
leave the same stream state and raise the same errors through ``_chat.ChatTaker.take`` as through
``StreamState.take`` with the Anthropic Messages and OpenAI Responses adapters' parsers, for
generated events in every shape their fields can take and for hostile lines. Which lines the C
side takes itself is checked too, so the test cannot pass by handing everything to Python."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.engine import sse_state
from loadgen.engine.health import ChunkCounts
from loadgen.engine.outcome import StreamResult
from loadgen.engine.sse_state import StreamState
from targets.adapters.anthropic import AnthropicMessagesAdapter
from targets.adapters.responses import OpenAIResponsesAdapter, _Link, _ResponsesStream

from .test_compiled_chat_diff import _take_reads  # the state after each read, the Messages stream's start too

_chat = sse_state._chat
pytestmark = pytest.mark.skipif(_chat is None, reason="the compiled chunk path is not built (make setup builds it)")

MESSAGES, RESPONSES = "anthropic-messages", "openai-responses"


def _state(kind: str, chained: bool = False) -> tuple[StreamState, object]:
    if kind == MESSAGES:
        stream = AnthropicMessagesAdapter().new_stream()
    elif chained:  # server-side history: the request's link, where the reply's id goes
        stream = _ResponsesStream(_Link(n_messages=2, digest=b"d"))
    else:
        stream = OpenAIResponsesAdapter().new_stream()
    return StreamState(stream.parse_line, StreamResult(), ChunkCounts()), stream


def _run(reads: list[list[bytes]], kind: str, compiled: bool) -> list:
    s, stream = _state(kind)
    return _take_reads(reads, s, stream, _chat.ChatTaker(s, stream, kind).take if compiled else s.take)


def _same(reads: list[list[bytes]], kind: str) -> None:
    assert _run(reads, kind, True) == _run(reads, kind, False), (kind, reads)


TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=6) | st.sampled_from(
    ["", "a", "é", "\n", '"', "\\", "/", "\u2028", "\U0001f600", "\x00", "tab\there"]
)
ODD = st.sampled_from([None, 0, 1, True, False, "", "x", [], [1], {}, {"a": 1}, 10**20, 1e300])


@st.composite
def _messages_event(draw) -> dict:
    kind = draw(
        st.sampled_from(["content_block_delta"] * 6 + ["content_block_start", "content_block_stop", "ping",
                         "message_start", "message_delta", "message_stop", "error", "unknown_x"])
        | ODD
    )  # fmt: skip
    obj: dict = {"type": kind} if draw(st.integers(0, 9)) else {}
    if kind == "content_block_delta" or draw(st.integers(0, 5)) == 0:
        obj["index"] = draw(st.sampled_from([0, 1, None]))
        if draw(st.integers(0, 9)) == 0:
            obj["delta"] = draw(ODD)
        else:
            dtype = draw(st.sampled_from(["text_delta", "thinking_delta", "input_json_delta"] * 2 + ["signature_delta", "citations_delta"]) | ODD)
            d: dict = {"type": dtype} if draw(st.integers(0, 9)) else {}
            own = {"text_delta": "text", "thinking_delta": "thinking", "input_json_delta": "partial_json"}.get(dtype) if type(dtype) is str else None
            for key in ("text", "thinking", "partial_json", "signature"):
                if draw(st.integers(0, 3)) if key == own else draw(st.integers(0, 2)) == 0:
                    d[key] = draw(TEXT | ODD)
            obj["delta"] = d
    if kind == "message_start" and draw(st.booleans()):
        obj["message"] = {"usage": draw(st.sampled_from([{"input_tokens": 5, "cache_read_input_tokens": 2}, None, 3]))}
    if kind == "message_delta" and draw(st.booleans()):
        obj["usage"] = draw(st.sampled_from([{"output_tokens": 7}, {"input_tokens": 1, "output_tokens": 2}, None]))
    if draw(st.integers(0, 9)) == 0:
        obj["error"] = draw(st.sampled_from([None, {"type": "overloaded_error", "message": "busy"}, "text"]))
    return obj


@st.composite
def _responses_event(draw) -> dict:
    kind = draw(
        st.sampled_from(["response.output_text.delta"] * 5 + [
            "response.reasoning_text.delta", "response.reasoning_summary_text.delta", "response.refusal.delta",
            "response.function_call_arguments.delta", "response.created", "response.in_progress",
            "response.output_item.added", "response.content_part.added", "response.output_text.done",
            "response.completed", "response.incomplete", "response.failed", "error"])
        | ODD
    )  # fmt: skip
    obj: dict = {"type": kind} if draw(st.integers(0, 9)) else {}
    if draw(st.integers(0, 3)):
        obj["delta"] = draw(TEXT | ODD)
    if draw(st.integers(0, 3)) == 0:
        obj["item_id"] = draw(st.sampled_from(["msg_1", "x\u00e9"]))
        obj["output_index"] = 0
        obj["sequence_number"] = draw(st.sampled_from([1, 2, 10**17]))
    if kind in ("response.completed", "response.incomplete", "response.created", "response.failed") and draw(st.booleans()):
        obj["response"] = draw(st.sampled_from([
            {"id": "resp_1", "usage": {"input_tokens": 5, "output_tokens": 3}},
            {"id": "resp_2", "error": {"code": "server_error", "message": "boom"}},
            None, 3]))  # fmt: skip
    if draw(st.integers(0, 9)) == 0:
        obj["error"] = draw(st.sampled_from([None, {"code": "rate_limit_exceeded", "message": "slow"}, "text"]))
    return obj


def _line_of(draw, event) -> bytes:
    body = json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode()
    how = draw(st.integers(0, 9))
    if how == 0:
        body = json.dumps(event).encode()  # spaces, \u escapes
    elif how == 1:
        body = body.replace(b'"type"', b'"type":"x","type"', 1)  # a repeated key: the last wins
    prefix = draw(st.sampled_from([b"data: ", b"data: ", b"data: ", b"data:", b"data:  "]))
    return prefix + body + draw(st.sampled_from([b"", b"", b"\r", b" "]))


def _line(kind: str):
    @st.composite
    def line(draw) -> bytes:
        pick = draw(st.integers(0, 9))
        if pick == 0:
            return draw(st.sampled_from([b"", b"\r", b"data: [DONE]", b"data:[DONE]", b": ping", b"event: content_block_delta",
                                         b"event: response.output_text.delta\r", b"event:", b" event: x", b"id: 4",
                                         b"eventx", b"data:", b"data: ", b"data: {", b"data: {} x", b"data: [1]"]))  # fmt: skip
        if pick == 1:
            return draw(st.binary(max_size=40))
        return _line_of(draw, draw(_messages_event() if kind == MESSAGES else _responses_event()))

    return line()


@settings(max_examples=500, deadline=None)
@given(st.lists(st.lists(_line(MESSAGES), max_size=5), min_size=1, max_size=8))
def test_the_compiled_messages_path_leaves_the_python_paths_state(reads: list[list[bytes]]) -> None:
    _same(reads, MESSAGES)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.lists(_line(RESPONSES), max_size=5), min_size=1, max_size=8))
def test_the_compiled_responses_path_leaves_the_python_paths_state(reads: list[list[bytes]]) -> None:
    _same(reads, RESPONSES)


MESSAGES_STREAM = [
    b"event: message_start",
    b'data: {"type":"message_start","message":{"id":"msg_1","usage":{"input_tokens":12,"output_tokens":1}}}',
    b"",
    b"event: content_block_start",
    b'data: {"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}',
    b'data: {"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"hmm"}}',
    b'data: {"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"abc"}}',
    b'data: {"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Hel"}}',
    b'data: {"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"lo \\"w\\"\\n"}}',
    b'data: {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\\"a\\""}}',
    b'data: {"type":"ping"}',
    b'data: {"type":"content_block_stop","index":2}',
    b'data: {"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":4}}',
    b'data: {"type":"message_stop"}',
]

RESPONSES_STREAM = [
    b"event: response.created",
    b'data: {"type":"response.created","response":{"id":"resp_1","status":"in_progress"}}',
    b"",
    b'data: {"type":"response.output_item.added","output_index":0,"item":{"type":"reasoning"}}',
    b'data: {"type":"response.reasoning_summary_text.delta","delta":"think","sequence_number":3}',
    b'data: {"type":"response.output_text.delta","item_id":"msg_1","delta":"Hel","sequence_number":4}',
    b'data: {"type":"response.output_text.delta","item_id":"msg_1","delta":"lo","sequence_number":5}',
    b'data: {"type":"response.function_call_arguments.delta","delta":"{\\"q\\"","sequence_number":6}',
    b'data: {"type":"response.output_text.done","text":"Hello"}',
    b'data: {"type":"response.completed","response":{"id":"resp_1","usage":{"input_tokens":9,"output_tokens":4}}}',
]


@pytest.mark.parametrize(("kind", "lines", "said"), [
    (MESSAGES, MESSAGES_STREAM, ["nothing", None, "nothing", "nothing", "nothing", (1, 1, None), "nothing",
                                 (1, 0, "Hel"), (1, 0, 'lo "w"\n'), (1, 0, None), "nothing", "nothing", None, "done"]),
    (RESPONSES, RESPONSES_STREAM, ["nothing", None, "nothing", "nothing", (1, 1, None), (1, 0, "Hel"), (1, 0, "lo"),
                                   (1, 0, None), "nothing", None]),
])  # fmt: skip
def test_a_typical_stream_is_taken_in_c_and_equals_the_python_path(kind: str, lines: list[bytes], said: list) -> None:
    _same([[x] for x in lines], kind)
    _same([lines], kind)
    # Only the events that carry usage or an id are handed to Python (None).
    assert [_chat.read_line(x, False, kind) for x in lines] == said
    s, stream = _state(kind)
    take = _chat.ChatTaker(s, stream, kind).take
    assert [take([x], 5) for x in lines] == [False] * (len(lines) - 1) + [True]
    assert s.chunk_tokens == [1, 1, 1, 1] and s.reasoning == 1 and s.done
    assert s.usage is not None and s.usage.completion_tokens == 4


def test_the_worker_takes_both_apis_in_c_and_a_chained_responses_stream_keeps_its_reply_id() -> None:
    for kind in (MESSAGES, RESPONSES):
        s, _stream = _state(kind)
        take = sse_state.stream_take(s)
        assert getattr(take, "__self__", None).__class__.__name__ == ("ChatTaker" if sse_state.READER == "compiled" else "StreamState")
    # With server-side history the reply's id (response.created, response.completed) reaches the link.
    s, stream = _state(RESPONSES, chained=True)
    assert _chat.ChatTaker(s, stream, RESPONSES).take(list(RESPONSES_STREAM), 7)
    assert stream._link.response_id == "resp_1" and s.chunk_tokens == [1, 1, 1, 1]
