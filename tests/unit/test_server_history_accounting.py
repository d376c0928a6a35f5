"""Server-side history in the records and the summary: what the adapter left out becomes the
history tokens the server held, and the prompt check splits the client's count into sent and held."""

from __future__ import annotations

from analysis.prompt_check import format_prompt_check, prompt_tokens_check
from analysis.records import RequestRecord
from loadgen.conversation import Conversation
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
