"""Capture: which conversation a request continues, what a turn records, when a session closes."""

from __future__ import annotations

from loadgen.capture.assembly import CHAT, COMPLETIONS, SessionAssembler

SYS = {"role": "system", "content": "You are terse."}


def _user(text: str) -> dict:
    return {"role": "user", "content": text}


def _assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}


def _tool(text: str, call_id: str = "c1") -> dict:
    return {"role": "tool", "content": text, "tool_call_id": call_id}


def _turn(
    asm: SessionAssembler, messages: list[dict], *, key: str | None, t: float, end: float, out: int = 7
):
    pending = asm.begin(CHAT, {"messages": messages}, key, t)
    assert pending is not None
    asm.complete(pending, output_tokens=out, reply_text="ok", now_s=end)
    return pending.conversation


def _closed(asm: SessionAssembler) -> list:
    return asm.take_closed(1e9, everything=True)


def test_keyed_session_records_new_messages_output_lengths_and_think_times() -> None:
    asm = SessionAssembler(idle_timeout_s=60)
    h = [SYS, _user("fix the parser")]
    _turn(asm, h, key="s1", t=10.0, end=11.0, out=12)
    h += [_assistant("done, see diff"), _tool("3 passed")]
    _turn(asm, h, key="s1", t=11.25, end=12.0, out=5)
    h += [_assistant("all green"), _user("now lint it")]
    _turn(asm, h, key="s1", t=14.0, end=15.0, out=9)
    (conv,) = _closed(asm)
    assert conv.session_id == "s1"
    assert conv.system_prompt == "You are terse."
    assert [(t.content, t.role, t.max_tokens) for t in conv.turns] == [
        ("fix the parser", "user", 12),
        ("3 passed", "tool", 5),
        ("now lint it", "user", 9),
    ]
    assert [t.think_time_s for t in conv.turns] == [0.0, 0.25, 2.0]
    assert asm.stats.turns == 3 and asm.stats.requests == 3


def test_several_new_messages_become_one_turn_joined_and_tool_only_when_all_are_tool() -> None:
    asm = SessionAssembler(idle_timeout_s=60)
    h = [_user("run both checks")]
    _turn(asm, h, key="k", t=0, end=1)
    h += [_assistant(""), _tool("lint: ok", "a"), _tool("tests: ok", "b")]
    _turn(asm, h, key="k", t=2, end=3)
    h += [_assistant("both fine"), _tool("late output", "c"), _user("thanks, ship it")]
    _turn(asm, h, key="k", t=4, end=5)
    (conv,) = _closed(asm)
    assert (conv.turns[1].content, conv.turns[1].role) == ("lint: ok\n\ntests: ok", "tool")
    assert (conv.turns[2].content, conv.turns[2].role) == ("late output\n\nthanks, ship it", "user")


def test_without_header_the_longest_shared_history_picks_the_conversation() -> None:
    asm = SessionAssembler(idle_timeout_s=60)
    a = [SYS, _user("task A")]
    b = [SYS, _user("task B")]
    conv_a = _turn(asm, a, key=None, t=0, end=1)
    conv_b = _turn(asm, b, key=None, t=0.5, end=1.5)
    assert conv_a is not conv_b
    b2 = [*b, _assistant("b1"), _user("more B")]
    a2 = [*a, _assistant("a1"), _user("more A")]
    assert _turn(asm, b2, key=None, t=2, end=3) is conv_b
    assert _turn(asm, a2, key=None, t=2.5, end=3.5) is conv_a
    # A request that extends A's first turn but not its second is a new branch, not A's third turn.
    stale = [*a, _assistant("a1"), _user("other follow-up")]
    assert _turn(asm, stale, key=None, t=4, end=5) is not conv_a
    assert [t.content for t in conv_a.turns] == ["task A", "more A"]
    assert [t.content for t in conv_b.turns] == ["task B", "more B"]
    assert conv_b.turns[1].think_time_s == 0.5


def test_identical_histories_go_to_the_conversation_idle_longest() -> None:
    asm = SessionAssembler(idle_timeout_s=60)
    first = _turn(asm, [_user("hi")], key=None, t=0, end=1)
    second = _turn(asm, [_user("hi")], key=None, t=0, end=2)
    assert first is not second
    follow = [_user("hi"), _assistant("hello"), _user("next")]
    assert _turn(asm, follow, key=None, t=3, end=4) is first
    assert _turn(asm, follow, key=None, t=3, end=4) is second


def test_a_rewritten_history_closes_the_session_and_starts_key_hash_2() -> None:
    asm = SessionAssembler(idle_timeout_s=60)
    h = [SYS, _user("long task"), _assistant("long answer"), _user("go on")]
    _turn(asm, h[:2], key="s", t=0, end=1)
    _turn(asm, h, key="s", t=2, end=3)
    compacted = [SYS, _user("summary of the task so far"), _user("continue")]
    _turn(asm, compacted, key="s", t=4, end=5)
    closed_now = asm.take_closed(5.0)  # superseded: closed at once, not after the idle timeout
    assert [c.session_id for c in closed_now] == ["s"]
    (new,) = _closed(asm)
    assert new.session_id == "s#2"
    assert new.turns[0].content == "summary of the task so far\n\ncontinue"
    assert new.turns[0].think_time_s == 0.0


def test_a_cut_or_failed_reply_records_nothing_and_the_retry_continues_the_session() -> None:
    asm = SessionAssembler(idle_timeout_s=60)
    h = [_user("one")]
    _turn(asm, h, key="s", t=0, end=1)
    h2 = [*h, _assistant("r1"), _user("two")]
    cut = asm.begin(CHAT, {"messages": h2}, "s", 2.0)
    asm.drop(cut, cut=True, now_s=2.5)
    failed = asm.begin(CHAT, {"messages": h2}, "s", 3.0)
    asm.drop(failed, cut=False, now_s=3.1)
    _turn(asm, h2, key="s", t=3.5, end=4)
    (conv,) = _closed(asm)
    assert [t.content for t in conv.turns] == ["one", "two"]
    assert abs(conv.turns[1].think_time_s - 0.4) < 1e-9  # from the end of the last reply, failed or not
    assert (asm.stats.cut, asm.stats.failed, asm.stats.turns) == (1, 1, 2)


def test_history_from_before_the_capture_is_folded_into_the_first_turn() -> None:
    asm = SessionAssembler(idle_timeout_s=60)
    msgs = [SYS, _user("q1"), _assistant("a1"), _user("q2")]
    (conv,) = [_turn(asm, msgs, key=None, t=0, end=1)]
    assert conv.system_prompt == "You are terse."
    assert conv.turns[0].content == "q1\n\na1\n\nq2"


def test_completions_prompts_extend_by_text_less_the_reply() -> None:
    asm = SessionAssembler(idle_timeout_s=60)
    p1 = "<|user|>\nhello\n<|assistant|>\n"
    first = asm.begin(COMPLETIONS, {"prompt": p1}, None, 0.0)
    asm.complete(first, output_tokens=3, reply_text=" a b c", now_s=1.0)
    p2 = p1 + " a b c\n<|user|>\nagain\n<|assistant|>\n"
    second = asm.begin(COMPLETIONS, {"prompt": [p2]}, None, 1.5)
    assert second.conversation is first.conversation
    asm.complete(second, output_tokens=4, reply_text=" d", now_s=2.0)
    (conv,) = _closed(asm)
    assert [t.content for t in conv.turns] == [p1, "\n<|user|>\nagain\n<|assistant|>\n"]
    assert conv.turns[1].think_time_s == 0.5


def test_idle_sessions_close_after_the_timeout_and_unreadable_bodies_are_counted() -> None:
    asm = SessionAssembler(idle_timeout_s=10)
    _turn(asm, [_user("a")], key="x", t=0, end=1)
    busy = asm.begin(CHAT, {"messages": [_user("b")]}, "y", 0.0)
    assert asm.take_closed(5.0) == []
    assert [c.session_id for c in asm.take_closed(11.0)] == ["x"]
    assert asm.take_closed(100.0) == []  # "y" still has a request on the wire
    asm.complete(busy, output_tokens=0, reply_text="", now_s=100.0)
    assert [(c.session_id, c.turns[0].max_tokens) for c in asm.take_closed(111.0)] == [("y", 1)]
    assert asm.begin(CHAT, {"messages": "nope"}, None, 0.0) is None
    assert asm.begin(CHAT, ["not", "an", "object"], None, 0.0) is None
    assert asm.stats.not_recorded == 2


def test_without_keep_keys_sessions_get_generated_ids() -> None:
    asm = SessionAssembler(idle_timeout_s=60, keep_keys=False)
    _turn(asm, [_user("a")], key="alice@example.com", t=0, end=1)
    (conv,) = _closed(asm)
    assert conv.session_id == "capture-000001"


def test_content_parts_and_tool_calls_count_as_text_and_match_across_spellings() -> None:
    asm = SessionAssembler(idle_timeout_s=60)
    parts = {"role": "user", "content": [{"type": "text", "text": "look at"}, {"type": "image_url", "image_url": {}},
                                         {"type": "text", "text": "this chart"}]}  # fmt: skip
    call = {"id": "c1", "type": "function", "function": {"name": "grep", "arguments": '{"q": "TODO"}'}}
    first = [SYS, parts]
    conv = _turn(asm, first, key=None, t=0, end=1)
    assert conv.turns[0].content == "look at\nthis chart"
    # The client re-sends the history with other JSON spelling (key order, extra fields): same history.
    respelled = [{"content": "You are terse.", "role": "system", "name": None}, parts]
    follow = [*respelled, {"role": "assistant", "content": None, "tool_calls": [call]}, _tool("3 hits")]
    assert _turn(asm, follow, key=None, t=2, end=3) is conv
    pre_history = [_user("q"), {"role": "assistant", "content": None, "tool_calls": [call]}, _tool("1 hit")]
    other = _turn(asm, pre_history, key=None, t=4, end=5)
    assert other.turns[0].content == 'q\n\ngrep({"q": "TODO"})\n\n1 hit'
