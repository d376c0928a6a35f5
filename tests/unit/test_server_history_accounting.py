"""Server-side history in the records and the summary: what the adapter left out becomes the
history tokens the server held, and the prompt check splits the client's count into sent and held."""

from __future__ import annotations

from analysis.prompt_check import format_prompt_check, prompt_tokens_check
from analysis.records import RequestRecord
from loadgen.engine.conversation import Conversation
from targets.adapters.base import ChatRequest
from targets.adapters.responses import OpenAIResponsesAdapter
from workloads.dag import plan_session
from workloads.model import Session, Turn
from workloads.tokenizer import count_tokens

SESSION = Session("s1", "default", "be brief and exact", (Turn("plan the change", 8), Turn("now do it", 8)))


def test_held_messages_are_the_history_before_the_turn_and_their_tokens_leave_the_system_prompt_out() -> None:
    conv = Conversation(SESSION, plan_session(SESSION), count_tokens)
    adapter = OpenAIResponsesAdapter(server_history=True)
    first = adapter.build_request(ChatRequest(conv.messages_for(0), 8, "s1", "r0"))
    assert first.held_messages == 0 and conv.held_tokens(first.held_messages) == 0
    parser = adapter.new_stream()  # the reply's id, as the stream ends
    parser.parse_line(b'data: {"type":"response.completed","response":{"id":"resp_1","usage":null}}')
    conv.extend(0, "a plan in three steps")
    second = adapter.build_request(ChatRequest(conv.messages_for(1), 8, "s1", "r1"))
    assert second.held_messages == 3  # system, the first message, its reply
    held = conv.held_tokens(second.held_messages)
    assert held == count_tokens("plan the change") + count_tokens("a plan in three steps")
    assert conv.prompt_tokens(1) - held == count_tokens("be brief and exact") + count_tokens("now do it")


def _rec(request_id: str, turn: int, **counts: int) -> RequestRecord:
    return RequestRecord(request_id, "s", 0, turn, "first" if turn == 0 else "follow-up", "t", "x", "w", "ok",
                         t_sched_us=0, t_send_us=0, **counts)  # fmt: skip


def test_the_prompt_check_splits_sent_from_held_only_when_a_server_held_some() -> None:
    first = _rec("a", 0, prompt_tokens=30, client_prompt_tokens=25)
    follow_up = _rec("b", 1, prompt_tokens=80, client_prompt_tokens=70, server_held_prompt_tokens=50)
    check = prompt_tokens_check([first, follow_up], None)
    assert check is not None
    assert (check["client_tokens"], check["server_held_tokens"], check["sent_tokens"]) == (95, 50, 45)
    line = format_prompt_check(check)
    assert line is not None and "sent 45 of the client's, the server held the other 50 (server-side history)" in line
    plain = prompt_tokens_check([first], None)
    assert plain is not None and "server_held_tokens" not in plain
    assert "server-side" not in (format_prompt_check(plain) or "")


def _tool_session_messages() -> list[dict]:
    return [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "run the tests"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_w1", "type": "function", "function": {"name": "run_tests", "arguments": "{}"}},
            {"id": "call_w2", "type": "function", "function": {"name": "read_file", "arguments": "{}"}},
        ]},
        {"role": "tool", "tool_call_id": "call_w1", "content": "3 passed"},
        {"role": "tool", "tool_call_id": "call_w2", "content": "file text"},
        {"role": "user", "content": "now fix it"},
    ]  # fmt: skip


def _follow_up_input(server_output: list[dict]) -> list[dict]:
    import orjson

    adapter = OpenAIResponsesAdapter(server_history=True)
    messages = _tool_session_messages()
    adapter.build_request(ChatRequest(messages[:2], 8, "s1", "r0"))
    completed = {"type": "response.completed", "response": {"id": "resp_1", "usage": None, "output": server_output}}
    adapter.new_stream().parse_line(b"data: " + orjson.dumps(completed))
    body = orjson.loads(adapter.build_request(ChatRequest(messages, 8, "s1", "r1")).body)
    assert body["previous_response_id"] == "resp_1"
    return body["input"]


def test_a_follow_up_answers_the_servers_own_function_calls() -> None:
    """The server holds the calls its reply made; a stored call left without an output is refused
    by the API, so the workload's results answer the server's call ids, in order."""
    items = _follow_up_input([{"type": "function_call", "call_id": "call_srv", "name": "run_tests", "arguments": "{}"}])
    outputs = [(i["call_id"], i["output"]) for i in items if i["type"] == "function_call_output"]
    calls = [i["call_id"] for i in items if i["type"] == "function_call"]
    # One server call: the first result answers it; the workload's second call is sent as the client's.
    assert outputs == [("call_srv", "3 passed"), ("call_w2", "file text")]
    assert calls == ["call_w2"]


def test_server_calls_beyond_the_workloads_results_get_empty_outputs_and_none_are_left_unanswered() -> None:
    server = [{"type": "function_call", "call_id": f"call_s{k}", "name": "t", "arguments": "{}"} for k in range(3)]
    items = _follow_up_input(server)
    outputs = {i["call_id"]: i["output"] for i in items if i["type"] == "function_call_output"}
    assert outputs == {"call_s0": "3 passed", "call_s1": "file text", "call_s2": ""}
    assert not [i for i in items if i["type"] == "function_call"]


def test_a_reply_without_calls_keeps_the_workloads_calls_as_before() -> None:
    items = _follow_up_input([{"type": "message", "role": "assistant", "content": []}])
    assert [i["call_id"] for i in items if i["type"] == "function_call"] == ["call_w1", "call_w2"]
    assert [i["call_id"] for i in items if i["type"] == "function_call_output"] == ["call_w1", "call_w2"]


def test_a_wide_fan_out_keeps_the_parents_link_for_its_join() -> None:
    """Twenty children each add a link; the join still continues the parent's response."""
    import orjson

    adapter = OpenAIResponsesAdapter(server_history=True)
    base = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "plan"}]
    adapter.build_request(ChatRequest(base, 8, "s1", "r0"))
    adapter.new_stream().parse_line(b'data: {"type":"response.completed","response":{"id":"resp_parent","usage":null}}')
    reply = {"role": "assistant", "content": "a plan"}
    for k in range(20):
        adapter.build_request(ChatRequest([*base, reply, {"role": "user", "content": f"child {k}"}], 8, "s1", f"c{k}"))
        adapter.new_stream().parse_line(b'data: {"type":"response.completed","response":{"id":"resp_c%d","usage":null}}' % k)
    join = adapter.build_request(ChatRequest([*base, reply, {"role": "user", "content": "results: ..."}], 8, "s1", "j"))
    assert orjson.loads(join.body)["previous_response_id"] == "resp_parent"
