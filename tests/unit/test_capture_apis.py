"""Capture of the agent APIs: Anthropic Messages and OpenAI Responses requests become sessions.

Sessions keyed by header or by history prefix in each API's own shape, Responses chains followed
through ``previous_response_id``, tool results recorded as steps naming the tool they answer, and
each API's replies metered (length, end of stream, a Responses reply's id and function calls).
"""

from __future__ import annotations

import orjson
import pytest

from loadgen.capture.apis import CHAT, COMPLETIONS, MESSAGES, RESPONSES, endpoint_of, read_request
from loadgen.capture.assembly import SessionAssembler
from loadgen.capture.reply import ReplyMeter
from loadgen.capture.writer import SessionRenderer, SessionSnapshot
from workloads import load_workload
from workloads.dag import plan_turns

SYSTEM = "You are a coding agent."


def _closed(asm: SessionAssembler) -> list:
    return sorted(asm.take_closed(1e9, everything=True), key=lambda c: c.seq)


def _turn(asm, endpoint, body, *, key=None, t, end, out=7, response_id=None, calls=None):
    pending = asm.begin(endpoint, body, key, t)
    assert pending is not None and pending.endpoint == endpoint
    asm.complete(
        pending, output_tokens=out, reply_text="", now_s=end, response_id=response_id, reply_calls=calls
    )
    return pending.conversation


@pytest.mark.parametrize(
    ("path", "endpoint"),
    [
        ("/v1/chat/completions", CHAT),
        ("/v1/completions", COMPLETIONS),
        ("/v1/messages", MESSAGES),
        ("/proxy/v1/responses", RESPONSES),
        ("/v1/models", None),
    ],
)
def test_endpoint_of_names_the_four_recorded_apis(path: str, endpoint: str | None) -> None:
    assert endpoint_of("POST", path) == endpoint
    assert endpoint_of("GET", path) is None


# --- Anthropic Messages ---------------------------------------------------------------------------


def _messages_body(history: list[dict], **extra) -> dict:
    return {"model": "m", "max_tokens": 64, "system": SYSTEM, "messages": history, "stream": True, **extra}


def test_messages_sessions_by_history_prefix_with_tool_use_and_tool_result_steps() -> None:
    asm = SessionAssembler(idle_timeout_s=60)
    a = [{"role": "user", "content": [{"type": "text", "text": "fix the parser"}]}]
    b = [{"role": "user", "content": "write the docs"}]
    _turn(asm, MESSAGES, _messages_body(a), t=0.0, end=1.0, out=12)
    _turn(asm, MESSAGES, _messages_body(b), t=0.5, end=1.5, out=4)
    # Session a: the reply called a tool; the agent sends its result (resending the whole history).
    a += [
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hm", "signature": "x"},
                {"type": "text", "text": "Reading it."},
                {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "parser.py"}},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "def parse(): ..."}],
        },
    ]
    _turn(asm, MESSAGES, _messages_body(a), t=1.25, end=2.0, out=9)
    a += [{"role": "assistant", "content": "Fixed."}, {"role": "user", "content": "now run the tests"}]
    _turn(asm, MESSAGES, _messages_body(a), t=3.0, end=4.0, out=5)
    conv_a, conv_b = _closed(asm)
    assert conv_a.system_prompt == SYSTEM and len(conv_b.turns) == 1
    assert [(t.content, t.role, t.max_tokens, t.tool_call) for t in conv_a.turns] == [
        ("fix the parser", "user", 12, None),
        ("def parse(): ...", "tool", 9, "read_file"),
        ("now run the tests", "user", 5, None),
    ]
    assert [t.think_time_s for t in conv_a.turns] == [0.0, 0.25, 1.0]


def test_messages_keyed_sessions_and_block_spellings_of_the_same_history_match() -> None:
    asm = SessionAssembler(idle_timeout_s=60)
    h = [{"role": "user", "content": "hello"}]
    _turn(asm, MESSAGES, _messages_body(h), key="k", t=0, end=1)
    # The same user message as a text block, the reply as blocks: still an extension.
    h2 = [
        {"role": "user", "content": [{"type": "text", "text": "hello"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "hi"}]},
        {"role": "user", "content": "bye"},
    ]
    _turn(asm, MESSAGES, _messages_body(h2), key="k", t=2, end=3)
    (conv,) = _closed(asm)
    assert conv.session_id == "k" and [t.content for t in conv.turns] == ["hello", "bye"]


# --- OpenAI Responses -----------------------------------------------------------------------------


def _responses_body(items: list[dict], **extra) -> dict:
    return {"model": "m", "instructions": SYSTEM, "input": items, "stream": True, "store": False, **extra}


def _user_item(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def test_responses_resent_history_with_function_calls_is_one_session() -> None:
    asm = SessionAssembler(idle_timeout_s=60)
    items = [_user_item("list the repo")]
    _turn(asm, RESPONSES, _responses_body(items), t=0, end=1, out=6)
    items += [
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Listing."}]},
        {"type": "function_call", "call_id": "call_9", "name": "shell", "arguments": '{"cmd": "ls"}'},
        {"type": "function_call_output", "call_id": "call_9", "output": "README.md\nsrc"},
    ]
    _turn(asm, RESPONSES, _responses_body(items), t=1.5, end=2, out=3)
    (conv,) = _closed(asm)
    assert conv.system_prompt == SYSTEM
    assert [(t.content, t.role, t.tool_call) for t in conv.turns] == [
        ("list the repo", "user", None),
        ("README.md\nsrc", "tool", "shell"),
    ]


def test_responses_chains_follow_previous_response_id_without_a_header() -> None:
    asm = SessionAssembler(idle_timeout_s=60)
    _turn(asm, RESPONSES, _responses_body([_user_item("plan it")]), t=0, end=1, out=8, response_id="resp_a1",
          calls={"call_1": "read_file"})  # fmt: skip
    # An unrelated conversation with the same first message: only the id tells them apart.
    _turn(asm, RESPONSES, _responses_body([_user_item("plan it")]), t=0.1, end=1.1, response_id="resp_b1")
    out = {"type": "function_call_output", "call_id": "call_1", "output": "the file"}
    _turn(asm, RESPONSES, _responses_body([out], previous_response_id="resp_a1"), t=1.5, end=2, out=5,
          response_id="resp_a2")  # fmt: skip
    _turn(
        asm, RESPONSES, _responses_body([_user_item("ship it")], previous_response_id="resp_a2"), t=4, end=5
    )
    # A chain whose earlier response was never seen starts a session at what it sends.
    _turn(
        asm,
        RESPONSES,
        _responses_body([_user_item("from before")], previous_response_id="resp_old"),
        t=6,
        end=7,
    )
    a, b, c = _closed(asm)
    assert [(t.content, t.role, t.tool_call) for t in a.turns] == [
        ("plan it", "user", None),
        ("the file", "tool", "read_file"),
        ("ship it", "user", None),
    ]
    assert [t.think_time_s for t in a.turns] == [0.0, 0.5, 2.0]
    assert a.system_prompt == SYSTEM  # instructions are resent with each request, recorded once
    assert len(b.turns) == 1 and [t.content for t in c.turns] == ["from before"]


def test_a_keyed_chain_naming_another_keys_response_starts_a_new_session() -> None:
    asm = SessionAssembler(idle_timeout_s=60)
    _turn(asm, RESPONSES, _responses_body([_user_item("one")]), key="x", t=0, end=1, response_id="r1")
    _turn(asm, RESPONSES, _responses_body([_user_item("two")]), key="y", t=0, end=1, response_id="r2")
    _turn(
        asm, RESPONSES, _responses_body([_user_item("three")], previous_response_id="r1"), key="x", t=2, end=3
    )
    _turn(
        asm, RESPONSES, _responses_body([_user_item("four")], previous_response_id="r1"), key="y", t=4, end=5
    )
    sessions = {c.session_id: [t.content for t in c.turns] for c in _closed(asm)}
    assert sessions == {"x": ["one", "three"], "y": ["two"], "y#2": ["four"]}


@pytest.mark.parametrize(
    ("endpoint", "body"),
    [
        (MESSAGES, {"messages": []}),
        (MESSAGES, {"messages": [{"role": "system", "content": "x"}]}),
        (MESSAGES, {"messages": [{"role": "user", "content": 5}]}),
        (RESPONSES, {"input": []}),
        (RESPONSES, {"input": [{"type": "message", "role": "robot", "content": "x"}]}),
        (RESPONSES, {"input": "hi", "previous_response_id": 3}),
        (RESPONSES, {"input": "hi", "instructions": ["x"]}),
    ],
)
def test_bodies_not_in_the_apis_shape_are_not_recorded(endpoint: str, body: dict) -> None:
    assert read_request(endpoint, body) is None
    asm = SessionAssembler(idle_timeout_s=60)
    assert asm.begin(endpoint, body, None, 0.0) is None
    assert asm.stats.not_recorded == 1


# --- replies --------------------------------------------------------------------------------------


def _sse(kind: str, obj: dict) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **obj}) + b"\n\n"


MESSAGES_STREAM = b"".join(
    [
        _sse("message_start", {"message": {"id": "msg_1", "usage": {"input_tokens": 30, "output_tokens": 1}}}),
        _sse("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
        *(_sse("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": w}}) for w in " a b c".split(" ")[1:]),
        _sse("content_block_stop", {"index": 0}),
        _sse("message_delta", {"delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 11}}),
        _sse("message_stop", {}),
    ]
)  # fmt: skip
RESPONSE_DONE = {
    "id": "resp_42",
    "status": "completed",
    "output": [
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
        {"type": "function_call", "call_id": "call_7", "name": "grep", "arguments": "{}"},
    ],
    "usage": {"input_tokens": 20, "output_tokens": 13},
}
RESPONSES_STREAM = b"".join(
    [
        _sse("response.created", {"response": {"id": "resp_42", "status": "in_progress", "usage": None}}),
        _sse("response.output_text.delta", {"delta": "ok"}),
        _sse("response.function_call_arguments.delta", {"delta": "{}"}),
        _sse("response.completed", {"response": RESPONSE_DONE}),
    ]
)


@pytest.mark.parametrize("piece", [1, 7, 64, 10_000])
def test_messages_and_responses_streams_are_metered_whatever_the_pieces(piece: int) -> None:
    for endpoint, stream, tokens, rid, calls in (
        (MESSAGES, MESSAGES_STREAM, 11, None, None),
        (RESPONSES, RESPONSES_STREAM, 13, "resp_42", {"call_7": "grep"}),
    ):
        meter = ReplyMeter(endpoint, content_type="text/event-stream", content_encoding="")
        end_of_last_line = len(stream) - 2  # the last event's data line ends here (then a blank line)
        for i in range(0, len(stream), piece):
            assert meter.stream_done == (i > end_of_last_line)  # whole only once the end event is in
            meter.feed(stream[i : i + piece])
        assert meter.stream_done
        reply = meter.finish()
        assert reply is not None
        assert (reply.output_tokens, reply.response_id, reply.calls) == (tokens, rid, calls)


def test_a_stream_without_its_end_event_is_not_whole_and_an_error_event_is_not_recorded() -> None:
    meter = ReplyMeter(MESSAGES, content_type="text/event-stream", content_encoding="")
    meter.feed(MESSAGES_STREAM[: MESSAGES_STREAM.index(b"event: message_stop")])
    assert not meter.stream_done
    meter = ReplyMeter(RESPONSES, content_type="text/event-stream", content_encoding="")
    meter.feed(
        _sse("response.failed", {"response": {"id": "r", "error": {"code": "server_error", "message": "x"}}})
    )
    assert meter.finish() is None


def test_whole_messages_and_responses_bodies_are_metered() -> None:
    meter = ReplyMeter(RESPONSES, content_type="application/json", content_encoding="")
    meter.feed(orjson.dumps({"object": "response", **RESPONSE_DONE}))
    reply = meter.finish()
    assert reply is not None and (reply.output_tokens, reply.response_id, reply.calls) == (
        13,
        "resp_42",
        {"call_7": "grep"},
    )
    body = {
        "type": "message",
        "content": [{"type": "text", "text": "hi there"}],
        "usage": {"input_tokens": 3, "output_tokens": 2},
    }
    meter = ReplyMeter(MESSAGES, content_type="application/json", content_encoding="")
    meter.feed(orjson.dumps(body))
    reply = meter.finish()
    assert reply is not None and reply.output_tokens == 2 and reply.response_id is None


# --- the file -------------------------------------------------------------------------------------


def test_tool_steps_are_written_with_the_tool_they_answer_and_read_back(tmp_path) -> None:
    asm = SessionAssembler(idle_timeout_s=60)
    h = [{"role": "user", "content": "fix it"}]
    _turn(asm, MESSAGES, _messages_body(h), t=0, end=1)
    h += [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "read_file", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "body"}]}]},
    ]  # fmt: skip
    _turn(asm, MESSAGES, _messages_body(h), t=1.5, end=2)
    (conv,) = _closed(asm)
    path = tmp_path / "s.jsonl"
    path.write_bytes(SessionRenderer(tenant="t").line(SessionSnapshot.of(conv)))
    (session,) = load_workload(str(path)).sessions(0, 1)
    assert [(t.content, t.role, t.tool_call) for t in session.turns] == [
        ("fix it", "user", None),
        ("body", "tool", "read_file"),
    ]


# --- sub-agents -----------------------------------------------------------------------------------


def _task_call(call_id: str) -> dict:
    return {"type": "tool_use", "id": call_id, "name": "Task", "input": {"task": "explore"}}


def test_sub_agents_under_the_parents_key_become_fan_out_children_and_a_join(tmp_path) -> None:
    asm = SessionAssembler(idle_timeout_s=60)
    main = [{"role": "user", "content": "refactor the parser"}]
    _turn(asm, MESSAGES, _messages_body(main), key="cc", t=0.0, end=1.0, out=20)
    # Two sub-agents under the same key, with their own system prompt and tools: not a rewrite.
    sub_body = {"max_tokens": 64, "system": "You explore code.", "tools": [{"name": "grep"}]}
    a = [{"role": "user", "content": "find the callers of parse"}]
    b = [{"role": "user", "content": "find the tests of parse"}]
    _turn(asm, MESSAGES, {**sub_body, "messages": a}, key="cc", t=1.5, end=2.0, out=6)
    _turn(asm, MESSAGES, {**sub_body, "messages": b}, key="cc", t=1.75, end=2.5, out=8)
    a += [{"role": "assistant", "content": "grep says"}, {"role": "user", "content": "callers: a.py, b.py"}]
    _turn(asm, MESSAGES, {**sub_body, "messages": a}, key="cc", t=2.25, end=3.0, out=9)
    # The parent's next request carries both results: the join.
    main += [
        {"role": "assistant", "content": [_task_call("t1"), _task_call("t2")]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "callers found"},
            {"type": "tool_result", "tool_use_id": "t2", "content": "tests found"},
            {"type": "text", "text": "go ahead"},
        ]},
    ]  # fmt: skip
    _turn(asm, MESSAGES, _messages_body(main), key="cc", t=3.5, end=4.0, out=5)
    (conv,) = _closed(asm)
    assert conv.session_id == "cc" and asm.stats.subagent_requests_folded == 1
    rows = [(t.content, t.max_tokens, t.think_time_s, t.tool_call, t.kind) for t in conv.turns]
    assert rows == [
        ("refactor the parser", 20, 0.0, None, None),
        ("find the callers of parse\n\ngrep says\n\ncallers: a.py, b.py", 9, 0.5, "Task", "fan-out child"),
        ("find the tests of parse", 8, 0.75, "Task", "fan-out child"),
        ("go ahead", 5, 0.5, None, "join"),
    ]
    path = tmp_path / "s.jsonl"
    path.write_bytes(SessionRenderer(tenant="t").line(SessionSnapshot.of(conv)))
    (session,) = load_workload(str(path)).sessions(0, 1)
    plan = plan_turns(session.turns, where="s.jsonl")  # a valid DAG: two children of t0, then their join
    assert [(st.kind, st.parent_ids) for st in plan.steps] == [
        ("first", ()),
        ("fan-out child", ("t0",)),
        ("fan-out child", ("t0",)),
        ("join", ("t1", "t2")),
    ]
    assert [session.turns[i].tool_call for i in (1, 2)] == ["Task", "Task"]


def test_same_system_prompt_is_a_rewrite_not_a_sub_agent_and_no_join_ends_with_the_fan_out() -> None:
    asm = SessionAssembler(idle_timeout_s=60)
    _turn(asm, MESSAGES, _messages_body([{"role": "user", "content": "one"}]), key="k", t=0, end=1)
    _turn(asm, MESSAGES, _messages_body([{"role": "user", "content": "compacted"}]), key="k", t=2, end=3)
    _turn(asm, MESSAGES, {"max_tokens": 8, "system": "Sub.", "messages": [{"role": "user", "content": "task"}]},
          key="k", t=4, end=5, out=3)  # fmt: skip
    first, second = _closed(asm)
    assert (first.session_id, second.session_id) == ("k", "k#2")
    assert [(t.content, t.kind) for t in second.turns] == [("compacted", None), ("task", "fan-out child")]


def test_a_responses_sub_agent_chains_its_own_responses_and_the_chained_join_folds_it() -> None:
    asm = SessionAssembler(idle_timeout_s=60)
    _turn(asm, RESPONSES, _responses_body([_user_item("plan the refactor")]), key="cc", t=0, end=1, out=9,
          response_id="m1", calls={"call_task": "Task"})  # fmt: skip
    sub = {"instructions": "You explore code.", "stream": True}
    _turn(
        asm, RESPONSES, {**sub, "input": "find the callers"}, key="cc", t=1.25, end=2, out=4, response_id="s1"
    )
    _turn(asm, RESPONSES, {**sub, "input": "and their tests", "previous_response_id": "s1"}, key="cc",
          t=2.5, end=3, out=6, response_id="s2")  # fmt: skip
    result = {"type": "function_call_output", "call_id": "call_task", "output": "callers and tests"}
    _turn(asm, RESPONSES, _responses_body([result], previous_response_id="m1"), key="cc", t=3.5, end=4, out=5)
    (conv,) = _closed(asm)
    assert [(t.content, t.max_tokens, t.think_time_s, t.tool_call, t.kind) for t in conv.turns] == [
        ("plan the refactor", 9, 0.0, None, None),
        ("find the callers\n\nand their tests", 6, 0.25, "Task", "fan-out child"),
        (".", 5, 0.5, None, "join"),
    ]
    assert asm.stats.subagent_requests_folded == 1


# --- --anonymize ----------------------------------------------------------------------------------


def test_anonymized_lines_hold_no_text_and_shared_prefixes_share_block_ids(tmp_path) -> None:
    asm = SessionAssembler(idle_timeout_s=60)
    shared = [{"role": "user", "content": "the shared opening request of both sessions " * 4}]
    for key, extra in (("a", "alpha zebra"), ("b", "beta yak")):
        h = [*shared]
        _turn(asm, MESSAGES, _messages_body(h), key=key, t=0, end=1, out=5)
        h += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": f"{extra} " * 30}]
        _turn(asm, MESSAGES, _messages_body(h), key=key, t=2, end=3, out=6)
    renderer = SessionRenderer(tenant="t", anonymize_block_size=8)
    path = tmp_path / "anon.jsonl"
    path.write_bytes(b"".join(renderer.line(SessionSnapshot.of(c)) for c in _closed(asm)))
    text = path.read_text()
    for word in ("shared", "opening", "zebra", "yak", "coding", "agent"):  # the prompts' and system's words
        assert word not in text
    a, b = (orjson.loads(line) for line in text.splitlines())
    assert a["id"] != b["id"] and a["id"].startswith("anon-")
    assert a["turns"][0]["hash_ids"] == b["turns"][0]["hash_ids"]  # the same system prompt and first message
    assert a["turns"][1]["hash_ids"][0] != b["turns"][1]["hash_ids"][0]  # they differ from then on
    assert [t["max_tokens"] for t in a["turns"]] == [5, 6] and a["turns"][1]["think_time"] == 1.0
    sessions = list(load_workload(str(path)).sessions(0, 2))
    assert [len(s.turns) for s in sessions] == [2, 2]


# --- hostile bodies -------------------------------------------------------------------------------


def _junk(rng, depth: int = 0):
    pick = rng.randrange(9 if depth < 3 else 5)
    if pick == 0:
        return None
    if pick == 1:
        return rng.choice([True, False, 0, -1, 2**70, 1.5])
    if pick in (2, 3, 4):
        return rng.choice(["", "user", "assistant", "tool", "system", "text", "tool_use", "tool_result",
                           "message", "function_call", "function_call_output", "call_1", "x" * 50])  # fmt: skip
    if pick in (5, 6):
        return [_junk(rng, depth + 1) for _ in range(rng.randrange(4))]
    keys = ["role", "content", "type", "text", "id", "name", "input", "tool_use_id", "call_id", "output",
            "arguments", "tool_calls", "tool_call_id", "function"]  # fmt: skip
    return {rng.choice(keys): _junk(rng, depth + 1) for _ in range(rng.randrange(5))}


def test_any_body_shape_is_recorded_or_counted_never_an_exception() -> None:
    import random

    rng = random.Random(7)
    asm = SessionAssembler(idle_timeout_s=60)
    for i in range(3000):
        endpoint = (CHAT, MESSAGES, RESPONSES)[i % 3]
        body = {"messages" if endpoint != RESPONSES else "input": _junk(rng), "system": _junk(rng),
                "instructions": _junk(rng), "tools": _junk(rng)}  # fmt: skip
        if rng.random() < 0.3:
            body["previous_response_id"] = rng.choice(["r1", "r2", None, 5])
        pending = asm.begin(endpoint, body, rng.choice([None, "k"]), float(i))
        if pending is not None:
            asm.complete(
                pending,
                output_tokens=3,
                reply_text="",
                now_s=i + 0.5,
                response_id=rng.choice(["r1", "r2", None]),
            )
    assert asm.stats.requests == 3000 and 0 < asm.stats.not_recorded < 3000
    assert asm.take_closed(1e9, everything=True) is not None
