"""The sim's tool-call replies: the knob, the draw, and each API's wire format read back by
loadgen's own adapters (tokens, reasoning, the first answer token, the finish reason)."""

from __future__ import annotations

from dataclasses import fields

import orjson
import pytest

from targets.adapters.anthropic import AnthropicMessagesAdapter
from targets.adapters.openai import OpenAIChatAdapter
from targets.adapters.responses import OpenAIResponsesAdapter
from targets.sim.profile import ProfileError, load_profile, profile_from_dict
from targets.sim.text import WORDS
from targets.sim.tool_calls import ToolCalls, ToolCallsError, arguments, parse_tool_calls, tool_called
from targets.sim.wire import CHAT, DONE, StreamTemplate, full_response
from targets.sim.wire_events import MessagesTemplate, ResponsesTemplate

WORD_IDS = [3, 14, 15, 9, 2]  # the reply's words, indices into WORDS
PROMPT, CACHED = 40, 16


def test_the_knob_parses_and_refuses_bad_values_in_one_line():
    assert parse_tool_calls({"fraction": 0.5, "tool": "run_tests"}, "p") == ToolCalls(0.5, "run_tests")
    assert parse_tool_calls({"fraction": 1}, "p") == ToolCalls(1.0, None)
    assert parse_tool_calls(None, "p") is None
    for bad in ({"fraction": 1.5}, {"fraction": True}, {}, {"fraction": 0.5, "tool": ""}, {"fraction": 0.5, "x": 1}, 3):
        with pytest.raises(ToolCallsError) as e:
            parse_tool_calls(bad, "p")
        assert "\n" not in str(e.value) and str(e.value).startswith("p: tool_calls")
    tiny = load_profile("tiny")
    base = {f.name: getattr(tiny, f.name) for f in fields(tiny)}
    base["tool_calls"] = {"fraction": 0.25}
    assert profile_from_dict(base).tool_calls == ToolCalls(0.25)
    with pytest.raises(ProfileError, match=r"tool_calls\.fraction"):
        profile_from_dict({**base, "tool_calls": {"fraction": -1}})


def test_the_draw_is_seeded_per_prompt_and_names_an_offered_tool():
    knob = ToolCalls(0.5, "run_tests")
    offered = ("read_file", "run_tests")
    prompts = [[i, i + 1, 7] for i in range(400)]
    calls = [tool_called(knob, 3, p, offered) for p in prompts]
    assert calls == [tool_called(knob, 3, p, offered) for p in prompts]  # deterministic
    assert calls != [tool_called(knob, 4, p, offered) for p in prompts]  # the seed matters
    share = sum(c is not None for c in calls) / len(calls)
    assert 0.4 < share < 0.6, share
    assert {c for c in calls if c} == {"run_tests"}
    assert tool_called(knob, 3, prompts[0], ("grep",)) in (None, "grep")  # not offered: the first tool
    assert all(tool_called(ToolCalls(1.0, "x"), 3, p, ("grep", "ls")) == "grep" for p in prompts[:20])
    assert tool_called(ToolCalls(1.0), 3, prompts[0], ()) is None  # no tools offered: a text reply
    assert tool_called(None, 3, prompts[0], offered) is None


def _expected_arguments() -> dict:
    return orjson.loads(arguments([" " + WORDS[w] for w in WORD_IDS]))


def _fold(adapter, lines: list[bytes]):
    """(tokens, reasoning tokens, index of the first answer token, text, usage) as the client folds events."""
    parser = adapter.new_stream()
    tokens = reasoning = 0
    first_answer = None
    text, usage = "", None
    for line in lines:
        ev = parser.parse_line(line)
        if ev is None:
            continue
        assert ev.error is None, ev.error
        if ev.tokens:
            if ev.reasoning:
                reasoning += ev.tokens
            elif first_answer is None:
                first_answer = tokens
            tokens += ev.tokens
        text += ev.text
        usage = ev.usage or usage
    return tokens, reasoning, first_answer, text, usage


def _event_stream(tpl, r: int, finish: str) -> bytes:
    """A Messages or Responses stream as the server writes it: opening, reasoning, the call, closing."""
    n = r + len(WORD_IDS)
    parts = [tpl.opening(PROMPT, CACHED)] + [tpl.reasoning_token() for _ in range(r)]
    if r:
        parts.append(tpl.answer_start())
    parts += [tpl.tool_token(w) for w in WORD_IDS]
    parts.append(tpl.closing(finish, PROMPT, n, CACHED))
    return b"".join(parts)


def _data(raw: bytes) -> list[dict]:
    return [orjson.loads(line[6:]) for line in raw.split(b"\n") if line.startswith(b"data: {")]


@pytest.mark.parametrize("r", [0, 3])
@pytest.mark.parametrize("finish", ["stop", "length"])
def test_chat_tool_call_stream_parses_to_its_tokens_and_finish_reason(r, finish):
    n = r + len(WORD_IDS)
    tpl = StreamTemplate(CHAT, "chatcmpl-abc", 1, "m", "run_tests", len(WORD_IDS))
    parts = [tpl.role()] + [tpl.reasoning_token() for _ in range(r)] + [tpl.tool_token(w) for w in WORD_IDS]
    raw = b"".join([*parts, tpl.finish(finish), tpl.usage(PROMPT, n, CACHED, r), DONE])
    tokens, reasoning, first_answer, text, usage = _fold(OpenAIChatAdapter(), raw.splitlines(keepends=True))
    assert (tokens, reasoning, first_answer, text) == (n, r, r, "")
    assert usage.completion_tokens == n
    chunks = _data(raw)
    calls = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks if c["choices"] and "tool_calls" in c["choices"][0]["delta"]]
    assert calls[0]["id"] == "call_abc" and calls[0]["type"] == "function" and calls[0]["function"]["name"] == "run_tests"
    assert all(c["index"] == 0 and "name" not in c["function"] for c in calls[1:])
    assert orjson.loads("".join(c["function"]["arguments"] for c in calls)) == _expected_arguments()
    reasons = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert reasons == ["tool_calls" if finish == "stop" else "length"]

    text_args = arguments([" " + WORDS[w] for w in WORD_IDS])
    body = full_response(CHAT, "chatcmpl-abc", 1, "m", text_args, PROMPT, n, CACHED, r, finish, "run_tests")
    ev = OpenAIChatAdapter().parse_response(body)
    assert (ev.tokens, ev.text, ev.usage.reasoning_tokens if r else 0) == (n, "", r)
    choice = orjson.loads(body)["choices"][0]
    assert choice["message"]["content"] is None and choice["finish_reason"] == reasons[0]
    assert orjson.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]) == _expected_arguments()


@pytest.mark.parametrize("r", [0, 3])
@pytest.mark.parametrize("finish", ["stop", "length"])
def test_messages_tool_use_stream_parses_to_its_tokens_and_stop_reason(r, finish):
    n = r + len(WORD_IDS)
    raw = _event_stream(MessagesTemplate("msg_abc", "m", r, "run_tests", len(WORD_IDS)), r, finish)
    tokens, reasoning, first_answer, text, usage = _fold(AnthropicMessagesAdapter(), raw.splitlines(keepends=True))
    assert (tokens, reasoning, first_answer, text) == (n, r, r, "")
    assert usage.completion_tokens == n and usage.prompt_tokens == PROMPT
    events = _data(raw)
    start = [e["content_block"] for e in events if e["type"] == "content_block_start"][-1]
    assert start == {"type": "tool_use", "id": "toolu_abc", "name": "run_tests", "input": {}}
    pieces = [e["delta"]["partial_json"] for e in events if e.get("delta", {}).get("type") == "input_json_delta"]
    assert orjson.loads("".join(pieces)) == _expected_arguments()
    stop = [e["delta"]["stop_reason"] for e in events if e["type"] == "message_delta"]
    assert stop == ["tool_use" if finish == "stop" else "max_tokens"]

    text_args = arguments([" " + WORDS[w] for w in WORD_IDS])
    body = MessagesTemplate("msg_abc", "m", r, "run_tests").full(text_args, finish, PROMPT, n, CACHED)
    ev = AnthropicMessagesAdapter().parse_response(body)
    assert (ev.tokens, ev.text, ev.usage.reasoning_tokens or 0) == (n, "", r)
    block = orjson.loads(body)["content"][-1]
    assert block["type"] == "tool_use" and block["input"] == _expected_arguments()


@pytest.mark.parametrize("r", [0, 3])
@pytest.mark.parametrize("finish", ["stop", "length"])
def test_responses_function_call_stream_parses_to_its_tokens_and_status(r, finish):
    n = r + len(WORD_IDS)
    raw = _event_stream(ResponsesTemplate("resp_abc", 1, "m", r, "run_tests", len(WORD_IDS)), r, finish)
    tokens, reasoning, first_answer, text, usage = _fold(OpenAIResponsesAdapter(), raw.splitlines(keepends=True))
    assert (tokens, reasoning, first_answer, text) == (n, r, r, "")
    assert usage.completion_tokens == n and usage.reasoning_tokens == r
    events = _data(raw)
    added = [e["item"] for e in events if e["type"] == "response.output_item.added"][-1]
    assert added["type"] == "function_call" and added["name"] == "run_tests" and added["call_id"] == "call_abc"
    deltas = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert orjson.loads("".join(deltas)) == _expected_arguments()
    done = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert len(done) == 1 and orjson.loads(done[0]["arguments"]) == _expected_arguments()
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    status = "completed" if finish == "stop" else "incomplete"
    assert events[-1]["type"] == "response." + status
    assert events[-1]["response"]["output"][-1]["type"] == "function_call"

    text_args = arguments([" " + WORDS[w] for w in WORD_IDS])
    body = ResponsesTemplate("resp_abc", 1, "m", r, "run_tests").full(text_args, finish, PROMPT, n, CACHED)
    ev = OpenAIResponsesAdapter().parse_response(body)
    assert (ev.tokens, ev.text, ev.usage.reasoning_tokens) == (n, "", r)
    obj = orjson.loads(body)
    assert obj["status"] == status and orjson.loads(obj["output"][-1]["arguments"]) == _expected_arguments()
