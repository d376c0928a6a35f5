"""Anthropic Messages adapter: request shape from loadgen's conversations, and parsing of recorded
Messages event streams (text, thinking, tool use, an error event, a cut stream)."""

from __future__ import annotations

import orjson
import pytest

from targets.adapters.anthropic import AnthropicMessagesAdapter, to_messages
from targets.adapters.base import BadChunk, StreamEvent, Usage
from tests.unit import transcripts
from tests.unit.transcripts import TRANSCRIPTS, fold, request

ADAPTER = AnthropicMessagesAdapter()


def replay(name: str) -> list[StreamEvent]:
    return transcripts.replay(ADAPTER, name)


# ---- build_request -----------------------------------------------------------------------------


def test_request_body_and_headers():
    p = AnthropicMessagesAdapter().build_request(request(model="claude-x", session_header="X-Affinity"))
    assert (p.method, p.path, p.stream) == ("POST", "/v1/messages", True)
    body = orjson.loads(p.body)
    assert body == {
        "model": "claude-x",
        "max_tokens": 64,
        "system": "You are terse.",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "metadata": {"user_id": "sess-9"},
    }
    assert p.headers["X-Affinity"] == "sess-9"
    assert p.headers["X-Request-ID"] == "req-9-1"
    assert p.headers["Accept"] == "text/event-stream"
    assert p.headers["anthropic-version"] == "2023-06-01"


def test_auth_is_x_api_key_with_the_version():
    assert AnthropicMessagesAdapter.auth_headers("sk-ant-1") == {
        "anthropic-version": "2023-06-01",
        "x-api-key": "sk-ant-1",
    }
    assert "x-api-key" not in AnthropicMessagesAdapter.auth_headers(None)
    assert "Authorization" not in AnthropicMessagesAdapter.auth_headers("sk-ant-1")


def test_options_are_sent_when_set():
    a = AnthropicMessagesAdapter(temperature=0.5, ignore_eos=True)
    body = orjson.loads(a.build_request(request(stream=False)).body)
    assert body["temperature"] == 0.5 and body["ignore_eos"] is True and body["stream"] is False
    assert "ignore_eos" not in orjson.loads(AnthropicMessagesAdapter().build_request(request()).body)
    assert a.options() == {"temperature": 0.5, "ignore_eos": True}


def test_tool_calls_and_results_become_blocks_in_alternating_turns():
    history = [
        {"role": "system", "content": "S1"},
        {"role": "system", "content": "S2"},
        {"role": "user", "content": "plan it"},
        {
            "role": "assistant",
            "content": "calling",
            "tool_calls": [
                {"id": "call_a", "type": "function", "function": {"name": "grep", "arguments": '{"task": "a"}'}},
                {"id": "call_b", "type": "function", "function": {"name": "ls", "arguments": '{"task": "b"}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "out a"},
        {"role": "tool", "tool_call_id": "call_b", "content": "out b"},
        {"role": "user", "content": "and now?"},
        {"role": "assistant", "content": ""},  # an empty reply: no empty content is sent
        {"role": "user", "content": "again"},
    ]
    system, messages = to_messages(history)
    assert system == "S1\n\nS2"
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[1]["content"] == [
        {"type": "text", "text": "calling"},
        {"type": "tool_use", "id": "call_a", "name": "grep", "input": {"task": "a"}},
        {"type": "tool_use", "id": "call_b", "name": "ls", "input": {"task": "b"}},
    ]
    assert messages[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "call_a", "content": "out a"},
        {"type": "tool_result", "tool_use_id": "call_b", "content": "out b"},
        {"type": "text", "text": "and now?"},
        {"type": "text", "text": "again"},
    ]


def test_openai_tool_definitions_become_messages_tools():
    tools = [
        {
            "type": "function",
            "function": {"name": "grep", "description": "Run grep.", "parameters": {"type": "object"}},
        }
    ]
    p = AnthropicMessagesAdapter().build_request(request(extra_body={"tools": tools, "top_k": 5}))
    body = orjson.loads(p.body)
    assert body["tools"] == [{"name": "grep", "description": "Run grep.", "input_schema": {"type": "object"}}]
    assert body["top_k"] == 5
    assert AnthropicMessagesAdapter.accepts_tools


# ---- streams -----------------------------------------------------------------------------------


def test_text_stream():
    events = replay("anthropic_messages_text.sse")
    tokens, text, usage, done, error = fold(events)
    assert (tokens, text, done, error) == (5, "The quick brown fox jumps.", True, None)
    # input_tokens is the uncached part: the prompt is it plus the cache reads.
    assert usage == Usage(prompt_tokens=125, completion_tokens=6, cached_tokens=100)
    assert events[-1].done and not events[-1].tokens


def test_message_start_alone_gives_the_prompt_and_no_completion_count():
    line = (TRANSCRIPTS / "anthropic_messages_text.sse").read_bytes().splitlines()[1]
    ev = AnthropicMessagesAdapter().parse_line(line)
    assert ev == StreamEvent(usage=Usage(125, None, 100))


def test_thinking_deltas_are_tokens_but_not_reply_text():
    tokens, text, usage, done, error = fold(replay("anthropic_messages_thinking.sse"))
    # 3 thinking deltas + 2 text deltas; the signature delta is not a token.
    assert (tokens, text, done, error) == (5, "Yes, 42.", True, None)
    assert usage == Usage(40, 9, 0)
    flags = [e.reasoning for e in replay("anthropic_messages_thinking.sse") if e is not None and e.tokens]
    assert flags == [True] * 3 + [False] * 2


def test_tool_use_argument_deltas_are_tokens():
    tokens, text, usage, done, error = fold(replay("anthropic_messages_tool_use.sse"))
    # 2 text deltas + 3 non-empty input_json deltas (the empty first one carries nothing).
    assert (tokens, text, done, error) == (5, "Checking now.", True, None)
    assert usage == Usage(472, 89, 0)


def test_error_event_is_an_overloaded_5xx():
    events = replay("anthropic_messages_error.sse")
    tokens, text, _, done, error = fold(events)
    assert (tokens, text, done) == (2, "Hello there", False)
    assert error is events[-1]
    assert error.error_code == 529 and "overloaded_error" in error.error and "Overloaded" in error.error


@pytest.mark.parametrize(
    ("err_type", "code"),
    [("rate_limit_error", 429), ("invalid_request_error", 400), ("api_error", 500), ("new_kind_error", None)],
)
def test_error_types_map_to_statuses(err_type, code):
    line = b'data: {"type":"error","error":{"type":"' + err_type.encode() + b'","message":"m"}}'
    ev = AnthropicMessagesAdapter().parse_line(line)
    assert ev.error is not None and ev.error_code == code


def test_cut_stream_has_no_end():
    tokens, text, usage, done, error = fold(replay("anthropic_messages_cut.sse"))
    assert (tokens, text, done, error) == (3, "Hello there my", False, None)
    assert usage == Usage(30, None, 0)


def test_event_lines_pings_and_blanks_carry_nothing():
    parser = AnthropicMessagesAdapter().new_stream()
    for line in (b"event: ping\n", b"\n", b": keep-alive\n", b'data: {"type":"ping"}\n', b'data: {"type":"new"}'):
        assert parser.parse_line(line) is None


def test_broken_lines_are_bad_chunks():
    parser = AnthropicMessagesAdapter().new_stream()
    with pytest.raises(BadChunk):
        parser.parse_line(b'data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"')
    with pytest.raises(BadChunk):
        parser.parse_line(b'data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":7}}')
    with pytest.raises(BadChunk):
        parser.parse_line(b"garbage")


def test_non_streaming_reply():
    body = orjson.dumps(
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "x"},
                {"type": "text", "text": "Four."},
                {"type": "tool_use", "id": "t1", "name": "calc", "input": {}},
            ],
            "stop_reason": "tool_use",
            "usage": {"input_tokens": 10, "cache_read_input_tokens": 5, "output_tokens": 12},
        }
    )
    ev = AnthropicMessagesAdapter().parse_response(body)
    assert (ev.tokens, ev.text, ev.done, ev.usage) == (12, "Four.", True, Usage(15, 12, 5, 1))
    err = AnthropicMessagesAdapter().parse_response(
        b'{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}'
    )
    assert err.error_code == 429


def test_a_non_streamed_replys_thinking_counts_as_reasoning_tokens():
    # The API reports no reasoning count: the thinking text's tokens (the shared tokenizer), as a
    # stream counts one per thinking delta; 0 reasoning tokens without a thinking block.
    blocks = [{"type": "thinking", "thinking": " ponder ponder ponder", "signature": "s"}, {"type": "text", "text": " ok"}]
    usage = {"input_tokens": 7, "output_tokens": 4}
    ev = AnthropicMessagesAdapter().parse_response(orjson.dumps({"type": "message", "content": blocks, "usage": usage}))
    assert ev.usage.reasoning_tokens == 3 and ev.usage.completion_tokens == 4 and ev.text == " ok"
    plain = orjson.dumps({"type": "message", "content": blocks[1:], "usage": usage})
    assert AnthropicMessagesAdapter().parse_response(plain).usage.reasoning_tokens is None


def test_a_typeless_line_is_an_error_object_or_a_bad_chunk():
    ev = ADAPTER.new_stream().parse_line(b'data: {"error":{"type":"api_error","message":"upstream down"}}')
    assert ev.error == "api_error: upstream down" and ev.error_code == 500
    with pytest.raises(BadChunk):
        ADAPTER.new_stream().parse_line(b'data: {"delta":{"type":"text_delta","text":"x"}}')
