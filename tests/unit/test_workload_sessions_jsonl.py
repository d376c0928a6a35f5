"""Session files: replay as written, round trip with export, validation naming file, line and key."""

from __future__ import annotations

import json

import pytest

from workloads import WorkloadError, load_workload, write_sessions_jsonl
from workloads.tokenizer import count_tokens


def _lines(tmp_path, *objs, name="s.jsonl"):
    p = tmp_path / name
    p.write_text("".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objs))
    return p


GOOD = {"id": "a", "turns": [{"content": "hello there", "max_tokens": 5}]}


def _message(fn, *args) -> str:
    """The one-line message ``fn(*args)`` raises."""
    with pytest.raises(WorkloadError) as err:
        fn(*args)
    msg = str(err.value)
    assert "\n" not in msg
    return msg


@pytest.mark.parametrize("name", ["demo-agents", "tiny"])
@pytest.mark.parametrize("include_text", [True, False])
def test_export_then_replay_gives_identical_sessions(tmp_path, name, include_text):
    wl = load_workload(name)
    path = write_sessions_jsonl(wl, 42, 25, tmp_path / "out.jsonl", include_text=include_text)
    replay = load_workload(str(path))
    assert replay.num_sessions == 25
    assert replay.name == "out" and replay.source == str(path)
    for k in range(25):
        assert replay.session(42, k) == wl.session(42, k)
    # a second export of the replay is byte-identical
    again = write_sessions_jsonl(replay, 42, 25, tmp_path / "again.jsonl", include_text=include_text)
    assert again.read_bytes() == path.read_bytes()


def test_cold_turns_round_trip(tmp_path):
    spec = tmp_path / "cold.yaml"
    spec.write_text("name: cold\nturns: 2\nuser_tokens: 5\noutput_tokens: 3\ncold_prefill: true\n")
    wl = load_workload(str(spec))
    replay = load_workload(str(write_sessions_jsonl(wl, 1, 3, tmp_path / "c.jsonl")))
    assert all(t.cold for t in replay.session(1, 2).turns)
    assert replay.session(1, 2) == wl.session(1, 2)


def test_given_text_ignores_seed_and_tokens_follow_it(tmp_path):
    p = _lines(
        tmp_path,
        {
            "id": "x",
            "tenant": "t1",
            "system_prompt": "be brief",
            "turns": [
                {"content": "first question", "max_tokens": 7},
                {"tokens": 40, "max_tokens": 9, "think_time": "1500ms", "role": "tool"},
            ],
        },
        {"id": "y", "system_prompt_tokens": 25, "turns": [{"tokens": 12, "max_tokens": 3}]},
    )
    wl = load_workload(str(p))
    assert wl.num_sessions == 2 and wl.tenants == ("t1", "default")
    s1, s2 = wl.session(1, 0), wl.session(2, 0)
    assert s1.session_id == "x" and s1.tenant == "t1" and s1.system_prompt == "be brief"
    assert s1.turns[0].content == s2.turns[0].content == "first question"
    assert s1.turns[1].role == "tool" and s1.turns[1].think_time_s == 1.5 and s1.turns[1].max_tokens == 9
    assert count_tokens(s1.turns[1].content) == count_tokens(s2.turns[1].content) == 40
    assert s1.turns[1].content != s2.turns[1].content  # generated from (seed, index)
    assert wl.session(1, 0) == s1  # deterministic
    y = wl.session(1, 1)
    assert (
        y.tenant == "default"
        and count_tokens(y.system_prompt) == 25
        and count_tokens(y.turns[0].content) == 12
    )
    with pytest.raises(
        WorkloadError, match=r"s\.jsonl: session index 2 is out of range; the file holds 2 sessions"
    ):
        wl.session(1, 2)


def test_blank_lines_are_skipped_and_session_k_is_the_kth_object(tmp_path):
    p = _lines(tmp_path, GOOD, "", {**GOOD, "id": "b"}, "   ")
    wl = load_workload(str(p))
    assert [wl.session(0, k).session_id for k in range(wl.num_sessions)] == ["a", "b"]


def test_fingerprint_is_content_not_formatting(tmp_path):
    a = _lines(tmp_path, GOOD, name="a.jsonl")
    b = tmp_path / "b.jsonl"
    b.write_text('{ "turns" : [ {"max_tokens": 5, "content": "hello there"} ], "id": "a" }\n')
    c = _lines(tmp_path, {**GOOD, "id": "c"}, name="c.jsonl")
    fa, fb, fc = (load_workload(str(p)).fingerprint() for p in (a, b, c))
    assert fa == fb != fc
    d = load_workload(str(a)).to_dict()
    assert d == {"kind": "sessions", "name": "a", "source": str(a), "fingerprint": fa, "num_sessions": 1}


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            '{"id": "a", "turns": [',
            "line 2: not valid JSON (Expecting value at column 23); give one JSON object per line",
        ),
        ("[1, 2]", "line 2: [1, 2] is not a JSON object; give one session object per line"),
        (
            {**GOOD, "colour": 1},
            "line 2: colour: unknown key; use one of id, tenant, system_prompt, system_prompt_tokens, turns, arrival_s",
        ),
        ({"turns": GOOD["turns"]}, "line 2: id: missing; every session needs an id (a non-empty string)"),
        ({"id": "b"}, "line 2: turns: missing; every session needs a non-empty list of turns"),
        ({"id": "b", "turns": []}, "line 2: turns: [] is not allowed; use a non-empty list of turns"),
        (
            {"id": "a", "turns": GOOD["turns"]},
            'line 2: id: "a" already used on line 1; give every session a unique id',
        ),
        (
            {"id": "b", "turns": [{"content": "x"}]},
            "line 2: turns[0].max_tokens: missing; every turn needs max_tokens (an integer >= 1)",
        ),
        (
            {"id": "b", "turns": [{"content": "x", "max_tokens": 0}]},
            "line 2: turns[0].max_tokens: 0 is not allowed; use an integer >= 1",
        ),
        (
            {"id": "b", "turns": [{"content": "x", "max_tokens": -4}]},
            "line 2: turns[0].max_tokens: -4 is not allowed; use an integer >= 1",
        ),
        (
            {"id": "b", "turns": [{"max_tokens": 3}]},
            "line 2: turns[0].content: missing; give exactly one of content (text) or tokens (a count)",
        ),
        (
            {"id": "b", "turns": [{"content": "x", "tokens": 3, "max_tokens": 3}]},
            "line 2: turns[0].content: both given; give exactly one of content (text) or tokens (a count)",
        ),
        (
            {"id": "b", "turns": [{"tokens": 2.5, "max_tokens": 3}]},
            "line 2: turns[0].tokens: 2.5 is not allowed; use an integer >= 1",
        ),
        (
            {"id": "b", "turns": [{"content": "x", "max_tokens": 3, "rol": "user"}]},
            "line 2: turns[0].rol: unknown key; use one of content, tokens, max_tokens, think_time, role, cold, id, kind, parents, tool_call, hash_ids, block_size",
        ),
        (
            {"id": "b", "turns": [{"content": "x", "max_tokens": 3, "role": "assistant"}]},
            'line 2: turns[0].role: "assistant" is not allowed; use one of user, tool',
        ),
        (
            {
                "id": "b",
                "turns": [
                    {"content": "x", "max_tokens": 3},
                    {"content": "y", "max_tokens": 3, "think_time": "soon"},
                ],
            },
            'line 2: turns[1].think_time: "soon" is not a duration; use seconds >= 0 or e.g. "1500ms"',
        ),
        (
            {"id": "b", "turns": [{"content": "x", "max_tokens": 3, "think_time": 2}]},
            "line 2: turns[0].think_time: 2 on the first turn; the first turn starts at the session's arrival, "
            "so leave it out or use 0",
        ),
        (
            {"id": "b", "system_prompt": "s", "system_prompt_tokens": 3, "turns": GOOD["turns"]},
            "line 2: system_prompt_tokens: given with system_prompt; give one of the two",
        ),
        (
            {"id": "b", "system_prompt_tokens": -1, "turns": GOOD["turns"]},
            "line 2: system_prompt_tokens: -1 is not allowed; use an integer >= 0",
        ),
        (
            {"id": "b", "turns": [{"content": "x", "max_tokens": 3, "cold": "yes"}]},
            'line 2: turns[0].cold: "yes" is not allowed; use true or false',
        ),
    ],
)
def test_bad_lines_name_file_line_and_key(tmp_path, line, message):
    p = _lines(tmp_path, GOOD, line)
    with pytest.raises(WorkloadError) as err:
        load_workload(str(p))
    assert str(err.value) == f"{p} {message}"


def test_file_level_errors(tmp_path):
    empty = _lines(tmp_path, "", name="empty.jsonl")
    assert _message(load_workload, str(empty)) == (
        f"{empty}: holds no sessions; give one JSON object per line"
    )
    gone = tmp_path / "gone.jsonl"
    assert _message(load_workload, str(gone)) == (
        f"{gone}: no such file; give the path of a dataset, trace or session file"
    )
    wl = load_workload(str(_lines(tmp_path, GOOD)))
    with pytest.raises(WorkloadError, match=r"asked for 2 sessions but it holds 1; ask for fewer$"):
        write_sessions_jsonl(wl, 0, 2, tmp_path / "x.jsonl")
    assert not (tmp_path / "x.jsonl").exists()
