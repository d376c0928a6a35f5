"""What each step of a DAG session sends (loadgen.engine.conversation), and that the sim takes it."""

from __future__ import annotations

import pytest

from loadgen.engine.conversation import Conversation, tool_definitions
from targets.sim.api import BadRequest, parse_request
from targets.sim.wire import CHAT
from workloads.dag import plan_session
from workloads.model import Session, Turn
from workloads.tokenizer import render_chat, render_tools, token_ids

SESSION = Session(
    "s1",
    "default",
    "be brief",
    (
        Turn("plan it", 8, step_id="plan"),
        Turn("read a", 8, step_id="a", kind="fan-out child", tool_call="read_file"),
        Turn("read b", 8, step_id="b", kind="fan-out child"),
        Turn("decide", 8, step_id="decide", kind="join"),
        Turn("patched", 8, step_id="patch", tool_call="apply_patch", role="tool"),
    ),
)


def _prompt(messages, tools=()) -> list[int]:
    return parse_request(CHAT, {"messages": messages, "tools": list(tools) or None}, 16).prompt_ids


def test_children_extend_the_parent_and_the_join_sees_their_outputs():
    conv = Conversation(SESSION, plan_session(SESSION))
    assert conv.messages_for(0) == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "plan it"},
    ]
    conv.extend(0, "the plan")
    calls = conv.history[-1]["tool_calls"]
    assert conv.history[-1]["content"] == "the plan"
    assert [(c["id"], c["function"]["name"]) for c in calls] == [("call_a", "read_file")]  # b joins as text
    child_a, child_b = conv.messages_for(1), conv.messages_for(2)
    assert child_a[:-1] == child_b[:-1] == conv.history
    assert (child_a[-1], child_b[-1]) == ({"role": "user", "content": "read a"}, {"role": "user", "content": "read b"})
    conv.join([1, 2], ["A says", "B says"])
    assert conv.history[-2:] == [
        {"role": "tool", "tool_call_id": "call_a", "content": "A says"},
        {"role": "assistant", "content": "B says"},
    ]
    join = conv.messages_for(3)
    conv.extend(3, "patch it")
    assert conv.history[-1]["tool_calls"][0]["id"] == "call_patch"
    assert conv.messages_for(4)[-1] == {"role": "tool", "tool_call_id": "call_patch", "content": "patched"}

    # What a prefix cache needs: the parent's prompt and reply are a token prefix of each child's
    # prompt, and each child's context (without its own message) a prefix of the join's.
    tools = tool_definitions(SESSION)
    assert [t["function"]["name"] for t in tools] == ["apply_patch", "read_file"]
    parent = _prompt(conv.messages_for(0)[:2], tools) + token_ids("the plan")
    for child in (child_a, child_b):
        assert _prompt(child, tools)[: len(parent)] == parent
    shared = token_ids(render_tools(tools) + render_chat(child_a[:-1], add_generation_prompt=False))
    assert _prompt(join, tools)[: len(shared)] == shared


def test_the_sim_counts_tool_calls_and_tools_and_refuses_malformed_ones():
    msgs = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": '{"task": "x"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "file text"},
    ]  # fmt: skip
    plain = [{"role": "user", "content": "go"}, {"role": "assistant", "content": ""}, msgs[2]]
    assert len(_prompt(msgs)) > len(_prompt(plain))
    tools = tool_definitions(SESSION)
    assert len(_prompt(msgs, tools)) == len(_prompt(msgs)) + len(token_ids(render_tools(tools)))
    bad_call = [msgs[0], {"role": "assistant", "tool_calls": [{"id": "c1", "function": {}}]}]
    with pytest.raises(BadRequest, match=r"messages\[1\].tool_calls\[0\] must be an object with function.name"):
        parse_request(CHAT, {"messages": bad_call}, 16)
    with pytest.raises(BadRequest, match=r"messages\[0\].tool_call_id must be a string"):
        parse_request(CHAT, {"messages": [{"role": "tool", "tool_call_id": 3, "content": "x"}]}, 16)
    with pytest.raises(BadRequest, match=r"tools\[0\] must be an object with function.name"):
        parse_request(CHAT, {"messages": msgs, "tools": [{"type": "function"}]}, 16)


BRANCHED = Session(
    "s2",
    "default",
    "be brief",
    (
        Turn("plan it", 8, step_id="plan"),
        Turn("explore", 8, step_id="a", kind="fan-out child", tool_call="subagent"),
        Turn("more", 8, step_id="a.1", parent_ids=("a",)),
        Turn("done?", 8, step_id="a.2", parent_ids=("a.1",)),
        Turn("read b", 8, step_id="b", kind="fan-out child", tool_call="subagent"),
        Turn("decide", 8, step_id="decide", kind="join"),
    ),
)


def test_a_branch_keeps_its_own_history_and_its_last_output_joins_as_the_childs():
    words = lambda text: len(text.split())  # noqa: E731
    conv = Conversation(BRANCHED, plan_session(BRANCHED), words)
    conv.extend(0, "the plan")
    history = list(conv.history)
    assert conv.messages_for(1) == [*history, {"role": "user", "content": "explore"}]
    conv.extend_branch(1, "found x")
    assert conv.messages_for(2) == [
        *history, {"role": "user", "content": "explore"}, {"role": "assistant", "content": "found x"},
        {"role": "user", "content": "more"},
    ]  # fmt: skip
    # what the second step sends, in content tokens: the history, the branch so far, its message
    assert conv.prompt_tokens(2) == conv.history_tokens + 1 + 2 + 1
    conv.extend_branch(2, "found y too")
    third = conv.messages_for(3)
    assert third[len(history) :] == [
        {"role": "user", "content": "explore"}, {"role": "assistant", "content": "found x"},
        {"role": "user", "content": "more"}, {"role": "assistant", "content": "found y too"},
        {"role": "user", "content": "done?"},
    ]  # fmt: skip
    assert conv.prompt_tokens(3) == conv.history_tokens + 1 + 2 + 1 + 3 + 1
    # a server holding the branch's first exchange was not sent its tokens (system prompt aside)
    assert conv.held_tokens(len(history) + 2, 3) == conv.held_tokens(len(history)) + 1 + 2
    # the other child and the history are untouched by the branch
    assert conv.history == history and conv.messages_for(4) == [*history, {"role": "user", "content": "read b"}]
    conv.join([1, 4], ["x and y", "B says"])
    assert conv.history[len(history) :] == [
        {"role": "tool", "tool_call_id": "call_a", "content": "x and y"},
        {"role": "tool", "tool_call_id": "call_b", "content": "B says"},
    ]
    assert conv.messages_for(5) == [*conv.history, {"role": "user", "content": "decide"}]
    assert [c["id"] for c in history[-1]["tool_calls"]] == ["call_a", "call_b"]
