"""OpenAI-compatible adapters: request shape, and parsing of vLLM / llama-server transcripts."""

from __future__ import annotations

import orjson
import pytest

from targets.adapters.base import BadChunk, Usage
from targets.adapters.openai import OpenAIChatAdapter, OpenAICompletionsAdapter
from tests.unit.transcripts import MESSAGES, replay, request
from workloads.tokenizer import render_chat

TEXT = " The quick brown fox jumps over the lazy dog."


# ---- build_request -----------------------------------------------------------------------------


def test_chat_request_body_and_headers():
    p = OpenAIChatAdapter().build_request(request(model="m-1"))
    assert (p.method, p.path, p.stream) == ("POST", "/v1/chat/completions", True)
    assert p.headers == {
        "Content-Type": "application/json",
        "Accept": "text/event-stream",
        "X-Request-ID": "req-9-1",
        "X-Session-ID": "sess-9",
    }
    body = orjson.loads(p.body)
    assert body == {
        "model": "m-1",
        "max_tokens": 64,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
        "user": "sess-9",
        "messages": MESSAGES,
    }


def test_chat_engine_options_and_extras():
    a = OpenAIChatAdapter(ignore_eos=False, min_tokens=8, continuous_usage_stats=True, temperature=0.0)
    req = request(
        session_header="X-Affinity",
        extra_body={"top_p": 0.5, "max_tokens": 7},
        extra_headers={"X-Tenant": "t1"},
    )
    p = a.build_request(req)
    body = orjson.loads(p.body)
    assert "model" not in body and "ignore_eos" not in body
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert (body["min_tokens"], body["temperature"], body["top_p"]) == (8, 0.0, 0.5)
    assert body["max_tokens"] == 7  # extra_body wins
    assert p.headers["X-Affinity"] == "sess-9" and "X-Session-ID" not in p.headers
    assert p.headers["X-Tenant"] == "t1"


def test_request_that_does_not_ignore_eos():
    body = orjson.loads(OpenAIChatAdapter().build_request(request(ignore_eos=False)).body)
    assert "ignore_eos" not in body


def test_non_streaming_request_has_no_stream_options():
    p = OpenAIChatAdapter().build_request(request(stream=False))
    body = orjson.loads(p.body)
    assert body["stream"] is False and "stream_options" not in body
    assert p.headers["Accept"] == "application/json" and p.stream is False


def test_completions_request_renders_the_chat_template():
    p = OpenAICompletionsAdapter().build_request(request())
    body = orjson.loads(p.body)
    assert p.path == "/v1/completions"
    assert body["prompt"] == render_chat(MESSAGES) and "messages" not in body
    assert body["user"] == "sess-9" and body["stream_options"] == {"include_usage": True}


def test_auth_headers():
    assert OpenAIChatAdapter.auth_headers("sk-1") == {"Authorization": "Bearer sk-1"}
    assert OpenAIChatAdapter.auth_headers(None) == {}


# ---- parsing real-format streams ---------------------------------------------------------------


def test_vllm_chat_stream():
    events = replay(OpenAIChatAdapter(), "vllm_chat_stream.sse")
    role = events[0]
    assert role.tokens == 0 and role.text == ""  # role-only first chunk: not the first token
    tokens = [e for e in events if e.tokens]
    assert [e.tokens for e in tokens] == [1] * 10
    assert "".join(e.text for e in events) == TEXT
    usage = [e.usage for e in events if e.usage]
    assert usage == [Usage(42, 10, 16)]
    assert events[-2].tokens == 0  # the usage chunk carries no token
    assert events[-1].done and not any(e.done for e in events[:-1])


def test_vllm_continuous_usage_counts_multi_token_chunks():
    events = replay(OpenAIChatAdapter(continuous_usage_stats=True), "vllm_chat_continuous_usage.sse")
    tokens = [e.tokens for e in events if e.tokens]
    assert tokens == [1, 1, 2, 1, 1, 1, 1, 1, 1]  # " brown fox" came as one chunk of two tokens
    assert sum(tokens) == 10
    assert events[0].tokens == 0 and events[0].usage.completion_tokens == 0
    assert "".join(e.text for e in events) == TEXT
    assert [e.usage for e in events if e.usage][-1] == Usage(42, 10, 16)


def test_vllm_reasoning_counts_as_tokens():
    events = replay(OpenAIChatAdapter(), "vllm_chat_reasoning.sse")
    assert [e.tokens for e in events if e.tokens] == [1] * 8
    # Reasoning chunks are flagged, and their text is not reply text (not sent back).
    assert [e.reasoning for e in events if e.tokens] == [True] * 5 + [False] * 3
    assert "".join(e.text for e in events) == " The quick brown"
    assert events[-2].usage == Usage(42, 8, None)  # prompt_tokens_details: null


def test_vllm_reasoning_in_history_option_keeps_the_text():
    events = replay(OpenAIChatAdapter(reasoning_in_history=True), "vllm_chat_reasoning.sse")
    assert "".join(e.text for e in events) == "Okay, short answer. The quick brown"
    assert [e.reasoning for e in events if e.tokens] == [True] * 5 + [False] * 3


def test_newer_vllm_reasoning_field():
    line = b'data: {"choices":[{"index":0,"delta":{"reasoning":"Hmm"},"finish_reason":null}]}\n'
    ev = OpenAIChatAdapter().parse_line(line)
    assert (ev.tokens, ev.text, ev.reasoning) == (1, "", True)


def test_reasoning_and_content_in_one_chunk_is_an_answer_chunk():
    line = b'data: {"choices":[{"index":0,"delta":{"reasoning":"Hm","content":"Hi"}}]}\n'
    ev = OpenAIChatAdapter().parse_line(line)
    assert (ev.tokens, ev.text, ev.reasoning) == (1, "Hi", False)
    tool = b'data: {"choices":[{"index":0,"delta":{"reasoning":"Hm","tool_calls":[{"index":0}]}}]}\n'
    assert OpenAIChatAdapter().parse_line(tool).reasoning is False


def test_usage_reasoning_tokens_from_completion_tokens_details():
    line = (
        b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":9,'
        b'"completion_tokens_details":{"reasoning_tokens":6}}}\n'
    )
    assert OpenAIChatAdapter().parse_line(line).usage == Usage(5, 9, None, 6)


def test_non_streaming_reply_drops_reasoning_text():
    body = b'{"choices":[{"index":0,"message":{"reasoning_content":"Hm","content":"Hi"}}]}'
    assert OpenAIChatAdapter().parse_response(body).text == "Hi"
    assert OpenAIChatAdapter(reasoning_in_history=True).parse_response(body).text == "HmHi"
    only = b'{"choices":[{"index":0,"message":{"reasoning_content":"Hm","content":null}}]}'
    assert OpenAIChatAdapter().parse_response(only).tokens == 1


def test_llama_server_chat_stream():
    events = replay(OpenAIChatAdapter(), "llamacpp_chat_stream.sse")
    assert events[0].tokens == 0 and events[0].text == ""  # delta {"role": "assistant", "content": null}
    assert [e.tokens for e in events if e.tokens] == [1] * 10
    assert "".join(e.text for e in events) == TEXT
    finish = events[-3]
    assert finish.tokens == 0  # finish_reason chunk with an empty delta
    last = events[-2]
    assert last.usage == Usage(42, 10, 16)
    assert last.server_timings["cache_n"] == 16 and last.server_timings["predicted_n"] == 10
    assert events[-1].done


def test_completions_stream():
    events = replay(OpenAICompletionsAdapter(), "vllm_completions_stream.sse")
    assert [e.tokens for e in events if e.tokens] == [1] * 10
    assert "".join(e.text for e in events) == TEXT
    assert events[-2].usage == Usage(42, 10, 16) and events[-1].done


@pytest.mark.parametrize(
    "line",
    [
        b"\n",
        b"\r\n",
        b": ping\n",
        b"event: message\n",
        b"id: 7\n",
        b"retry: 1000\n",
        b"data:\n",
    ],
)
def test_lines_that_carry_nothing(line):
    assert OpenAIChatAdapter().parse_line(line) is None


@pytest.mark.parametrize(
    "line",
    [
        b'data: {"choices":[{"index":0,"delta":{"content":null},"finish_reason":null}]}\n',
        b'data: {"choices":[{"index":0,"delta":{"content":""},"finish_reason":"stop"}]}\n',
        b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}\n',
        b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}\n',
    ],
)
def test_chunks_without_generated_text_carry_no_token(line):
    ev = OpenAIChatAdapter().parse_line(line)
    assert ev is not None and ev.tokens == 0 and ev.text == "" and not ev.done


def test_crlf_and_no_space_after_data():
    ev = OpenAIChatAdapter().parse_line(b'data:{"choices":[{"delta":{"content":"x"}}]}\r\n')
    assert (ev.tokens, ev.text) == (1, "x")
    assert OpenAIChatAdapter().parse_line(b"data: [DONE]\r\n").done


def test_tool_call_delta_is_generated_output():
    line = b'data: {"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\\"a"}}]}}]}\n'
    ev = OpenAIChatAdapter().parse_line(line)
    assert ev.tokens == 1 and ev.text == ""


@pytest.mark.parametrize(
    "line",
    [
        b'data: {"choices": [\n',
        b"data: not json\n",
        b"data: [1, 2]\n",
        b'{"choices": []}\n',
        b"<html>502 Bad Gateway</html>\n",
    ],
)
def test_malformed_lines_raise_bad_chunk(line):
    with pytest.raises(BadChunk):
        OpenAIChatAdapter().parse_line(line)
    with pytest.raises(BadChunk):
        OpenAICompletionsAdapter().parse_line(line)


@pytest.mark.parametrize(
    ("line", "message", "code"),
    [
        (b'data: {"error":{"message":"too long","type":"BadRequestError","code":400}}\n', "too long", 400),
        (
            b'data: {"object":"error","message":"overloaded","type":"x","param":null,"code":503}\n',
            "overloaded",
            503,
        ),
        (b'data: {"error":"boom"}\n', "boom", None),
    ],
)
def test_error_objects_in_stream(line, message, code):
    ev = OpenAIChatAdapter().parse_line(line)
    assert (ev.error, ev.error_code, ev.tokens) == (message, code, 0)


def test_parse_response_non_streaming():
    body = orjson.dumps(
        {
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": " a b"}, "finish_reason": "length"}
            ],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
            "timings": {"cache_n": 3},
        }
    )
    ev = OpenAIChatAdapter().parse_response(body)
    assert (ev.text, ev.tokens, ev.done, ev.usage) == (" a b", 2, True, Usage(5, 2, None))
    assert ev.server_timings == {"cache_n": 3}
    ev = OpenAICompletionsAdapter().parse_response(b'{"choices":[{"text":"xyz"}]}')
    assert (ev.text, ev.tokens) == ("xyz", 1)
    with pytest.raises(BadChunk):
        OpenAIChatAdapter().parse_response(b"<html>")


def test_each_stream_has_its_own_state():
    a = OpenAIChatAdapter(continuous_usage_stats=True)
    line = b'data: {"choices":[{"delta":{"content":"ab"}}],"usage":{"completion_tokens":2}}\n'
    s1, s2 = a.new_stream(), a.new_stream()
    assert s1.parse_line(line).tokens == 2
    assert s2.parse_line(line).tokens == 2  # a fresh stream starts from zero
    line3 = b'data: {"choices":[{"delta":{"content":"c"}}],"usage":{"completion_tokens":3}}\n'
    assert s1.parse_line(line3).tokens == 1
