"""Dataset and trace readers: each fixture gives the documented sessions; bad input is one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from loadgen.config import Plan, RunConfig
from loadgen.engine.driver import build_schedule
from workloads import load_workload
from workloads.errors import WorkloadError
from workloads.readers import available_readers, detect_format, read_workload_file
from workloads.tokenizer import count_tokens

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "datasets"
SHAREGPT = FIX / "sharegpt.json"
MOONCAKE = FIX / "mooncake.jsonl"
AZURE = FIX / "azure.csv"


def test_builtin_readers_are_registered_and_detected_from_the_first_record(tmp_path):
    assert {"sessions", "sharegpt", "mooncake", "azure"} <= set(available_readers())
    assert detect_format(SHAREGPT) == "sharegpt"
    assert detect_format(MOONCAKE) == "mooncake"
    assert detect_format(AZURE) == "azure"
    lines = tmp_path / "conv.jsonl"  # ShareGPT as JSON lines is told apart from a session file
    lines.write_text(json.dumps({"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}) + "\n")
    assert detect_format(lines) == "sharegpt"
    sessions = tmp_path / "s.jsonl"
    sessions.write_text(json.dumps({"id": "a", "turns": [{"content": "x", "max_tokens": 2}]}) + "\n")
    assert detect_format(sessions) == "sessions"


def test_sharegpt_conversations_become_multi_turn_sessions_with_reply_lengths():
    raw = json.loads(SHAREGPT.read_text())
    wl = load_workload(SHAREGPT)
    assert wl.kind == "sharegpt" and wl.arrival_offsets() is None
    # Every conversation has at least one answered question, so none is dropped.
    assert wl.num_sessions == len(raw) == 40
    ids = [wl.session(0, k).session_id for k in range(wl.num_sessions)]
    assert len(set(ids)) == 40 and "conv016#1" in ids  # a repeated id is kept apart
    for k, conv in enumerate(raw):
        msgs = conv["conversations"]
        s = wl.session(3, k)
        if msgs[0]["from"] == "system":
            assert s.system_prompt == msgs[0]["value"]
            msgs = msgs[1:]
        while msgs and msgs[0]["from"] == "gpt":  # a reply before any question is left out
            msgs = msgs[1:]
        pairs = [(msgs[i], msgs[i + 1]) for i in range(0, len(msgs) - 1, 2)]
        assert len(s.turns) == len(pairs)
        for turn, (q, a) in zip(s.turns, pairs, strict=True):
            assert turn.content == q["value"]
            assert turn.role == ("tool" if q["from"] == "tool" else "user")
            assert turn.max_tokens == count_tokens(a["value"])
            assert turn.think_time_s == 0.0
    assert wl.stats["trailing_user_turns_left_out"] == sum(1 for c in raw if c["conversations"][-1]["from"] == "human")


def test_sharegpt_filters_drop_and_count_conversations():
    raw = json.loads(SHAREGPT.read_text())
    wl = read_workload_file(SHAREGPT, "sharegpt", "min_turns=3,max_turns=5,think_time=2s")
    kept = [wl.session(0, k) for k in range(wl.num_sessions)]
    assert all(3 <= len(s.turns) <= 5 for s in kept)
    assert all(t.think_time_s == 2.0 for s in kept for t in s.turns[1:])
    assert wl.num_sessions + sum(wl.stats["dropped"].values()) == len(raw)
    short = read_workload_file(SHAREGPT, None, {"max_prompt_tokens": "200"})
    assert 0 < short.num_sessions < len(raw)
    for k in range(short.num_sessions):
        s = short.session(0, k)
        ctx = count_tokens(s.system_prompt) + sum(count_tokens(t.content) for t in s.turns)
        ctx += sum(t.max_tokens for t in s.turns[:-1])
        assert ctx <= 200


def test_mooncake_blocks_share_prompt_prefixes_and_timestamps_give_arrivals():
    rows = [json.loads(line) for line in MOONCAKE.read_text().splitlines()]
    wl = load_workload(MOONCAKE)
    assert wl.num_sessions == len(rows) == 240
    offsets = wl.arrival_offsets()
    stamps = sorted(r["timestamp"] for r in rows)
    assert np.allclose(offsets, (np.array(stamps) - stamps[0]) / 1000.0)
    by_block_prefix: dict[tuple[int, ...], str] = {}
    for k in range(wl.num_sessions):
        s = wl.session(5, k)
        (turn,) = s.turns
        row = rows[int(s.session_id.rsplit("-L", 1)[1]) - 1]
        assert count_tokens(turn.content) == row["input_length"]
        assert turn.max_tokens == max(1, row["output_length"])
        words = turn.content.split(" ")
        for m in range(1, len(row["hash_ids"])):
            key = tuple(row["hash_ids"][:m])
            prefix = " ".join(words[: 512 * m])
            # The same leading blocks give the same text in every request that has them.
            assert by_block_prefix.setdefault(key, prefix) == prefix
    assert wl.session(5, 0).turns[0].content != wl.session(6, 0).turns[0].content  # texts follow the seed
    assert 0.5 < wl.stats["prefix_reuse"] < 0.95


def test_azure_rows_give_sizes_and_datetime_arrivals():
    wl = load_workload(AZURE)
    lines = AZURE.read_text().splitlines()[1:]
    assert wl.num_sessions == len(lines) == 200
    first = lines[0].split(",")
    s = wl.session(0, 0)
    assert count_tokens(s.turns[0].content) == int(first[1]) and s.turns[0].max_tokens == int(first[2])
    offsets = wl.arrival_offsets()
    assert offsets[0] == 0.0 and np.all(np.diff(offsets) >= 0)
    # 18:15:49.8230050 -> 18:15:50.4387670 is 0.615762 s
    assert offsets[1] == pytest.approx(0.615762, abs=1e-6)


def _plan(wl_path: str, **cfg) -> tuple[RunConfig, object]:
    config = RunConfig(run_id="r", workload=wl_path, arrival="trace", **cfg)
    return config, load_workload(wl_path)


def test_trace_schedules_scale_rescale_to_a_rate_and_cut():
    cfg, wl = _plan(str(MOONCAKE))
    base = wl.arrival_offsets()
    whole = [t for _, t in build_schedule(Plan(cfg, 1, 0, 0.0), wl)]
    assert np.allclose(whole, base)
    cfg.trace_time_scale = 0.1
    assert np.allclose([t for _, t in build_schedule(Plan(cfg, 1, 0, 0.0), wl)], base * 0.1)
    cfg.trace_time_scale, cfg.trace_rate_per_s = 1.0, 20.0
    fast = np.array([t for _, t in build_schedule(Plan(cfg, 1, 0, 0.0), wl)])
    assert (len(fast) - 1) / fast[-1] == pytest.approx(20.0)
    assert np.allclose(fast / fast[-1], base / base[-1])  # the shape is kept, only the speed changes
    cfg.trace_rate_per_s, cfg.num_sessions, cfg.duration_s = None, 50, 30.0
    cut = build_schedule(Plan(cfg, 2, 1, 0.0), wl)
    assert all(k % 2 == 1 and k < 50 and t < 30.0 for k, t in cut)


def test_session_files_carry_arrival_times_through_export(tmp_path):
    from workloads.sessions_jsonl import write_sessions_jsonl

    wl = load_workload(MOONCAKE)
    out = write_sessions_jsonl(wl, 2, 30, tmp_path / "mc.jsonl")
    back = load_workload(out)
    assert np.allclose(back.arrival_offsets(), wl.arrival_offsets()[:30])
    assert [back.session(2, k) for k in range(30)] == [wl.session(2, k) for k in range(30)]
    # Lines written out of order (a capture ends sessions in any order) replay in arrival order.
    lines = out.read_text().splitlines()
    shuffled = tmp_path / "shuffled.jsonl"
    shuffled.write_text("\n".join(reversed(lines)) + "\n")
    assert [load_workload(shuffled).session(2, k).session_id for k in range(30)] == [
        wl.session(2, k).session_id for k in range(30)
    ]


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("c.json", '[{"conversations": [{"from": "human", "value": "a"}]},\n {"conversations": 5}]', "c.json line 2: conversations: 5 is not a list"),
        ("c.json", '[{"conversations": [{"from": "alien", "value": "a"}]}]', "c.json line 1: conversations[0].from: unknown role"),
        ("c.json", '[{"conversations": [{"from": "human", "value": 7}]}]', "conversations[0].value: 7 is not text"),
        ("c.json", '[\n{"conversations": []},\n{"conversations": [}\n]', "c.json line 3: not valid JSON"),
        ("c.json", '[{"conversations": [{"from": "human", "value": "q"}]}]', "none of its 1 conversations is left"),
        ("m.jsonl", '{"timestamp": 1, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n{"timestamp": 2, "input_length": 600, "output_length": 2, "hash_ids": [1]}', "m.jsonl line 2: hash_ids: 1 blocks but input_length 600 needs 2"),
        ("m.jsonl", '{"timestamp": 1, "output_length": 2}', "m.jsonl line 1: input_length: missing; give input_length or text_input"),
        ("m.jsonl", '{"timestamp": 1, "input_length": 10, "output_length": 2}\n{"input_length": 10, "output_length": 2}', "m.jsonl line 2: timestamp: missing but line 1 has one"),
        ("m.jsonl", '{"timestamp": "x", "input_length": 10, "output_length": 2, "hash_ids": [1]}', "line 1: timestamp: \"x\" is not allowed"),
        ("m.jsonl", '{"timestamp": 1, "input_length": -4, "output_length": 2, "hash_ids": [1]}', "line 1: input_length: -4 is not allowed"),
        ("m.jsonl", '{"timestamp": 1, "input_length": 3, "output_length": 2, "hash_ids": [1]}\n{oops', "m.jsonl line 2: not valid JSON"),
        ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,10,2\n2023-11-16 18:15:47,ten,2\n", "a.csv line 3: ContextTokens: \"ten\" is not allowed"),
        ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\nsoon,10,2\n", "a.csv line 2: timestamp: 'soon' is not a time"),
        ("a.csv", "TIMESTAMP,Context,GeneratedTokens\n1,10,2\n", "a.csv line 1: no contexttokens column"),
    ],
)
def test_malformed_files_give_one_line_errors_with_file_line_and_field(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_text(content)
    fmt = {"c.json": "sharegpt", "m.jsonl": "mooncake", "a.csv": "azure"}[name]
    with pytest.raises(WorkloadError) as e:
        read_workload_file(path, fmt)
    text = str(e.value)
    assert message in text and "\n" not in text


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ("block_size=0", "block_size='0' is not allowed"),
        ("blocksize=512", "'blocksize' is not known to the mooncake reader; it takes: block_size, tenant"),
        ("block_size", "'block_size' is not key=value"),
    ],
)
def test_bad_reader_options_are_one_line(options, message):
    with pytest.raises(WorkloadError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_workload(MOONCAKE, options=options)


def test_unknown_format_and_undetectable_file(tmp_path):
    with pytest.raises(WorkloadError, match="unknown workload format 'parquet'"):
        load_workload(MOONCAKE, fmt="parquet")
    odd = tmp_path / "odd.txt"
    odd.write_text("hello\n")
    with pytest.raises(WorkloadError, match="cannot tell its format"):
        load_workload(odd)
