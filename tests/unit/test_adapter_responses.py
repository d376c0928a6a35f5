"""OpenAI Responses adapter: request shape from loadgen's conversations, and parsing of recorded
Responses event streams (text, reasoning, a function call, a failed response, a cut stream)."""

from __future__ import annotations

import orjson
import pytest

from targets.adapters.base import BadChunk, StreamEvent, Usage
from targets.adapters.responses import OpenAIResponsesAdapter, to_input
from tests.unit import transcripts
from tests.unit.transcripts import fold, request

ADAPTER = OpenAIResponsesAdapter()


def replay(name: str) -> list[StreamEvent]:
    return transcripts.replay(ADAPTER, name)


# ---- build_request -----------------------------------------------------------------------------


def test_request_body_and_headers():
    p = OpenAIResponsesAdapter().build_request(request(model="gpt-x", session_header="X-Affinity"))
    assert (p.method, p.path, p.stream) == ("POST", "/v1/responses", True)
    assert orjson.loads(p.body) == {
        "model": "gpt-x",
        "instructions": "You are terse.",
        "input": [{"type": "message", "role": "user", "content": "hi"}],
        "max_output_tokens": 64,
        "stream": True,
        "store": False,
        "user": "sess-9",
    }
    assert p.headers["X-Affinity"] == "sess-9"
    assert p.headers["X-Request-ID"] == "req-9-1"
    assert OpenAIResponsesAdapter.auth_headers("sk-1") == {"Authorization": "Bearer sk-1"}


def test_options_are_sent_when_set():
    a = OpenAIResponsesAdapter(temperature=0.0, ignore_eos=True, store=True)
    body = orjson.loads(a.build_request(request(stream=False)).body)
    assert (body["temperature"], body["ignore_eos"], body["store"], body["stream"]) == (0.0, True, True, False)
    assert "ignore_eos" not in orjson.loads(OpenAIResponsesAdapter().build_request(request()).body)


def test_tool_calls_and_outputs_become_items():
    history = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "plan it"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "call_a", "type": "function", "function": {"name": "grep", "arguments": '{"task": "a"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "out a"},
        {"role": "assistant", "content": "done"},
    ]
    instructions, items = to_input(history)
    assert instructions == "S"
    assert items == [
        {"type": "message", "role": "user", "content": "plan it"},
        {"type": "function_call", "call_id": "call_a", "name": "grep", "arguments": '{"task": "a"}'},
        {"type": "function_call_output", "call_id": "call_a", "output": "out a"},
        {"type": "message", "role": "assistant", "content": "done"},
    ]


def test_openai_chat_tool_definitions_become_flat_function_tools():
    tools = [{"type": "function", "function": {"name": "grep", "description": "Run grep.", "parameters": {}}}]
    body = orjson.loads(OpenAIResponsesAdapter().build_request(request(extra_body={"tools": tools})).body)
    assert body["tools"] == [
        {"type": "function", "name": "grep", "description": "Run grep.", "parameters": {"type": "object", "properties": {}}}
    ]


# ---- streams -----------------------------------------------------------------------------------


def test_text_stream():
    events = replay("responses_text.sse")
    tokens, text, usage, done, error = fold(events)
    assert (tokens, text, done, error) == (5, "The quick brown fox jumps.", True, None)
    assert usage == Usage(prompt_tokens=36, completion_tokens=6, cached_tokens=24, reasoning_tokens=0)
    assert events[-1].done and events[-1].usage == usage


def test_reasoning_deltas_are_tokens_but_not_reply_text():
    tokens, text, usage, done, error = fold(replay("responses_reasoning.sse"))
    # 2 summary deltas + 2 reasoning-text deltas + 2 output-text deltas.
    assert (tokens, text, done, error) == (6, "Pick B.", True, None)
    assert usage == Usage(80, 140, 0, 128)  # output_tokens counts the reasoning tokens
    events = replay("responses_reasoning.sse")
    assert [e.reasoning for e in events if e is not None and e.tokens] == [True] * 4 + [False] * 2


def test_function_call_argument_deltas_are_tokens():
    tokens, text, usage, done, error = fold(replay("responses_function_call.sse"))
    assert (tokens, text, done, error) == (4, "", True, None)
    assert usage == Usage(291, 23, 0, 0)
    assert not any(e.reasoning for e in replay("responses_function_call.sse") if e is not None)


def test_failed_response_is_a_5xx_error():
    events = replay("responses_failed.sse")
    tokens, text, _, done, error = fold(events)
    assert (tokens, text, done) == (2, "The quick", False)
    assert error is events[-1] and error.error_code == 500
    assert error.error == "server_error: The model failed to generate a response."


@pytest.mark.parametrize(
    ("line", "code"),
    [
        (b'data: {"type":"error","code":"rate_limit_exceeded","message":"slow","param":null}', 429),
        (b'data: {"type":"error","code":"invalid_prompt","message":"no","param":null}', 400),
        (b'data: {"type":"error","code":null,"message":"boom","param":null}', None),
        (b'data: {"type":"error","error":{"type":"invalid_request_error","code":null,"message":"x"}}', 400),
        (b'data: {"type":"error","code":"503","message":"busy"}', 503),
    ],
)
def test_error_events_map_to_statuses(line, code):
    ev = OpenAIResponsesAdapter().parse_line(line)
    assert ev.error is not None and ev.error_code == code


def test_incomplete_response_ends_the_stream_with_usage():
    line = (
        b'data: {"type":"response.incomplete","sequence_number":9,"response":{"status":"incomplete",'
        b'"incomplete_details":{"reason":"max_output_tokens"},"usage":{"input_tokens":5,"output_tokens":64}}}'
    )
    ev = OpenAIResponsesAdapter().parse_line(line)
    assert ev.done and ev.usage == Usage(5, 64, None)


def test_cut_stream_has_no_end():
    tokens, text, usage, done, error = fold(replay("responses_cut.sse"))
    assert (tokens, text, usage, done, error) == (3, "The quick brown", None, False, None)


def test_other_events_and_sse_fields_carry_nothing():
    parser = OpenAIResponsesAdapter().new_stream()
    for line in (b"event: response.created\n", b"\n", b": ping\n", b'data: {"type":"response.output_item.added"}'):
        assert parser.parse_line(line) is None
    assert parser.parse_line(b"data: [DONE]").done


def test_broken_lines_are_bad_chunks():
    parser = OpenAIResponsesAdapter().new_stream()
    with pytest.raises(BadChunk):
        parser.parse_line(b'data: {"type":"response.output_text.delta","delta":"')
    with pytest.raises(BadChunk):
        parser.parse_line(b'data: {"type":"response.output_text.delta","delta":3}')


def test_non_streaming_reply():
    body = orjson.dumps(
        {
            "id": "resp_1",
            "object": "response",
            "status": "completed",
            "error": None,
            "output": [
                {"type": "reasoning", "summary": []},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Four."}]},
            ],
            "usage": {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 4}, "output_tokens": 30},
        }
    )
    ev = OpenAIResponsesAdapter().parse_response(body)
    assert (ev.tokens, ev.text, ev.done, ev.usage) == (30, "Four.", True, Usage(10, 30, 4))
    failed = OpenAIResponsesAdapter().parse_response(
        b'{"object":"response","status":"failed","error":{"code":"server_error","message":"x"}}'
    )
    assert failed.error_code == 500


def test_a_typeless_line_is_an_error_object_or_a_bad_chunk():
    ev = ADAPTER.new_stream().parse_line(b'data: {"error":{"message":"upstream down","code":"server_error"}}')
    assert ev.error == "server_error: upstream down" and ev.error_code == 500
    with pytest.raises(BadChunk):
        ADAPTER.new_stream().parse_line(b'data: {"delta":"x"}')
