"""Production traces beyond Mooncake and Azure: BurstGPT CSV, Qwen-Bailian chains, Mooncake rows
without hash_ids (AIPerf's variant), and counts-only exports that keep a trace's shared blocks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from loadgen.cli import main
from loadgen.runtime.run_workload import load_workload_named
from workloads import load_workload, write_sessions_jsonl
from workloads.errors import WorkloadError
from workloads.readers import available_readers, detect_format
from workloads.tokenizer import count_tokens

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "datasets"
BURSTGPT = FIX / "burstgpt.csv"
BAILIAN = FIX / "bailian.jsonl"
MOONCAKE = FIX / "mooncake.jsonl"
MOONCAKE_AIPERF = FIX / "mooncake_aiperf.jsonl"
AZURE = FIX / "azure.csv"


def _sessions(wl, seed=0):
    return [wl.session(seed, k) for k in range(wl.num_sessions)]


# --- BurstGPT --------------------------------------------------------------------------------------


def test_burstgpt_is_registered_and_detected_apart_from_azure():
    assert {"burstgpt", "bailian"} <= set(available_readers())
    assert detect_format(BURSTGPT) == "burstgpt"
    assert detect_format(AZURE) == "azure"


def test_burstgpt_rows_are_one_turn_sessions_at_their_seconds_and_failed_rows_are_counted():
    wl = load_workload(BURSTGPT)
    assert wl.kind == "burstgpt"
    # 10 rows, 2 failed (Response tokens 0): skipped and counted.
    assert wl.num_sessions == 8
    assert wl.stats["dropped"] == {"zero_response_tokens": 2}
    assert np.allclose(wl.arrival_offsets(), [0, 56, 61, 95, 113, 113, 170, 226])
    s = _sessions(wl)
    assert [len(x.turns) for x in s] == [1] * 8
    assert count_tokens(s[0].turns[0].content) == 472 and s[0].turns[0].max_tokens == 18
    # A row with Request tokens 0 (and a reply) is sent as a 1-token prompt, counted.
    assert count_tokens(s[3].turns[0].content) == 1 and wl.stats["zero_request_rows"] == 1
    # Ties keep file order.
    assert [count_tokens(x.turns[0].content) for x in s[4:6]] == [761, 90]


def test_burstgpt_filters_by_model_and_log_type():
    wl = load_workload(BURSTGPT, options="model=ChatGPT,log_type=Conversation log")
    assert wl.num_sessions == 5
    assert wl.stats["dropped"] == {"model": 3, "log_type": 1, "zero_response_tokens": 1}
    assert np.allclose(wl.arrival_offsets(), [0, 95, 113, 113, 170])
    gpt4 = load_workload(BURSTGPT, options={"model": "gpt-4"})  # any case
    assert gpt4.num_sessions == 2


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n5,ChatGPT,x,3,3,API log\n",
         "b.csv line 2: Request tokens: \"x\" is not allowed"),
        ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\nsoon,ChatGPT,1,3,4,API log\n",
         "b.csv line 2: Timestamp: \"soon\" is not allowed"),
        ("Timestamp,Model,Request tokens,Log Type\n5,ChatGPT,1,API log\n", "b.csv line 1: no Response tokens column"),
    ],
)
def test_burstgpt_bad_rows_are_one_line_errors(tmp_path, content, message):
    f = tmp_path / "b.csv"
    f.write_text(content)
    with pytest.raises(WorkloadError) as e:
        load_workload(f, fmt="burstgpt")
    assert message in str(e.value) and "\n" not in str(e.value)


def test_burstgpt_unknown_option_and_filter_matching_nothing(tmp_path):
    with pytest.raises(WorkloadError, match="model_name"):
        load_workload(BURSTGPT, options="model_name=x")
    with pytest.raises(WorkloadError, match="no requests left"):
        load_workload(BURSTGPT, options="model=Claude")


# --- Qwen-Bailian ----------------------------------------------------------------------------------


def test_bailian_is_detected_apart_from_mooncake():
    assert detect_format(BAILIAN) == "bailian"
    assert detect_format(MOONCAKE) == "mooncake"


def test_bailian_timestamps_are_seconds_and_parent_chat_ids_chain_turns():
    wl = load_workload(BAILIAN)
    assert wl.kind == "bailian"
    assert [s.session_id for s in _sessions(wl)] == ["bailian-c159", "bailian-c171", "bailian-c180", "bailian-c173"]
    assert np.allclose(wl.arrival_offsets(), [0, 0.386, 0.886, 9.136])
    s0, s1, s2, s3 = _sessions(wl)
    # 159 -> 160 -> 161: a 61 s gap stays 61 s; follow-ups send what the context grew by.
    assert [count_tokens(t.content) for t in s0.turns] == [40, 70 - (40 + 12), 101 - (70 + 8)]
    assert [t.max_tokens for t in s0.turns] == [12, 8, 30]
    assert np.allclose([t.think_time_s for t in s0.turns], [0, 61.0, 7.886])
    # 171 -> 172 -> 174; 174's context is smaller than 172's prompt and reply: one new token, counted.
    assert [count_tokens(t.content) for t in s1.turns] == [36, 15, 1]
    assert np.allclose([t.think_time_s for t in s1.turns], [0, 2.5, 16.0])
    # An orphan (parent not in the file) and a second child of 171 start sessions of their own,
    # with their whole prompt.
    assert [count_tokens(t.content) for t in s2.turns] == [33]
    assert [count_tokens(t.content) for t in s3.turns] == [52]
    assert wl.stats["orphan_chats"] == 1 and wl.stats["branch_chats"] == 1
    assert wl.stats["context_not_grown"] == 1
    assert 0.3 < wl.stats["prefix_reuse"] < 0.5 and wl.stats["unique_blocks"] == 9
    # First turns share blocks by hash id (16 tokens each): 159 and 171 share [1, 2].
    w0, w1, w3 = (x.turns[0].content.split(" ") for x in (s0, s1, s3))
    assert w0[:32] == w1[:32] == w3[:32] and w0[32:] != w1[32:]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ({"chat_id": 1, "parent_chat_id": -1, "timestamp": "x", "input_length": 5, "output_length": 1},
         "t.jsonl line 1: timestamp"),
        ({"chat_id": 1, "parent_chat_id": -1, "timestamp": 1.0, "output_length": 1}, "t.jsonl line 1: input_length: missing"),
        ({"chat_id": 1, "parent_chat_id": -1, "timestamp": 1.0, "input_length": 40, "output_length": 1, "hash_ids": [1]},
         "t.jsonl line 1: hash_ids: 1 blocks but input_length 40 needs 3 of 16 tokens"),
        ({"chat_id": [1], "timestamp": 1.0, "input_length": 4, "output_length": 1}, "t.jsonl line 1: chat_id"),
    ],
)
def test_bailian_bad_lines_are_one_line_errors(tmp_path, line, message):
    f = tmp_path / "t.jsonl"
    f.write_text(json.dumps(line) + "\n")
    with pytest.raises(WorkloadError) as e:
        load_workload(f, fmt="bailian")
    assert message in str(e.value) and "\n" not in str(e.value)


def test_bailian_duplicate_chat_id_names_both_lines(tmp_path):
    f = tmp_path / "t.jsonl"
    row = {"chat_id": 1, "parent_chat_id": -1, "timestamp": 1.0, "input_length": 4, "output_length": 1}
    f.write_text(json.dumps(row) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(WorkloadError, match=r"t\.jsonl line 2: chat_id: 1 already used on line 1"):
        load_workload(f)


# --- Mooncake rows without hash_ids (AIPerf) -------------------------------------------------------


def test_mooncake_rows_without_hash_ids_are_detected_and_read_as_a_trace():
    assert detect_format(MOONCAKE_AIPERF) == "mooncake"
    wl = load_workload(MOONCAKE_AIPERF)
    assert wl.kind == "mooncake" and wl.num_sessions == 4
    assert np.allclose(wl.arrival_offsets(), [0, 1.0, 1.5, 4.25])
    s = _sessions(wl)
    assert count_tokens(s[0].turns[0].content) == 655 and s[0].turns[0].max_tokens == 52
    assert s[1].turns[0].content == "What is the capital of France?"  # text_input wins over input_length
    assert s[2].turns[0].content.startswith("Summarise the attached")
    assert count_tokens(s[3].turns[0].content) == 2048 and s[3].turns[0].max_tokens == 1
    # Two sessions' synthetic prompts are not shared prefixes (nothing says they are).
    assert s[0].turns[0].content.split(" ")[:8] != s[3].turns[0].content.split(" ")[:8]


def test_mooncake_row_with_neither_text_nor_length_is_one_line(tmp_path):
    f = tmp_path / "m.jsonl"
    f.write_text(json.dumps({"timestamp": 0, "output_length": 4}) + "\n")
    with pytest.raises(WorkloadError, match=r"m.jsonl line 1: input_length: missing; give input_length or text_input"):
        load_workload(f, fmt="mooncake")


# --- counts-only exports keep hash ids -------------------------------------------------------------


def _common_prefix_words(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a.split(" "), b.split(" "), strict=False):
        if x != y:
            break
        n += 1
    return n


def test_counts_only_export_of_mooncake_keeps_shared_prefixes(tmp_path):
    src = load_workload(MOONCAKE)
    out = write_sessions_jsonl(src, 7, src.num_sessions, tmp_path / "c.jsonl", include_text=False)
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert all("hash_ids" in t and t["block_size"] == 512 for rec in lines for t in rec["turns"])
    assert all("content" not in t for rec in lines for t in rec["turns"])
    replay = load_workload(out)
    assert replay.kind == "sessions"
    orig = _sessions(src, 7)
    again = _sessions(replay, 7)
    # The counts-only replay sends the very prompts the trace gives under the same seed.
    assert [s.turns[0].content for s in again] == [s.turns[0].content for s in orig]
    # Sessions with shared leading hash ids share a prompt prefix of exactly those blocks' tokens.
    ids = [rec["turns"][0]["hash_ids"] for rec in lines]
    checked = 0
    for i in range(len(ids)):
        for j in range(i + 1, min(len(ids), i + 20)):
            shared = 0
            while shared < min(len(ids[i]), len(ids[j])) - 1 and ids[i][shared] == ids[j][shared]:
                shared += 1
            if shared:
                a, b = again[i].turns[0].content, again[j].turns[0].content
                assert _common_prefix_words(a, b) >= 512 * shared
                assert count_tokens(" ".join(a.split(" ")[: 512 * shared])) == 512 * shared
                checked += 1
    assert checked > 50


def test_counts_only_export_of_bailian_keeps_first_turn_blocks(tmp_path):
    src = load_workload(BAILIAN)
    out = write_sessions_jsonl(src, 3, src.num_sessions, tmp_path / "b.jsonl", include_text=False)
    rec = json.loads(out.read_text().splitlines()[0])
    assert rec["turns"][0]["hash_ids"] == [1, 2, 3] and rec["turns"][0]["block_size"] == 16
    assert "hash_ids" not in rec["turns"][1]  # a follow-up's new text is its own
    replay = load_workload(out)
    assert [t.content for s in _sessions(replay, 3) for t in s.turns] == [
        t.content for s in _sessions(src, 3) for t in s.turns
    ]
    assert np.allclose(replay.arrival_offsets(), src.arrival_offsets())


def test_session_file_hash_ids_are_checked_and_old_files_still_read(tmp_path):
    old = tmp_path / "old.jsonl"
    old.write_text(json.dumps({"id": "a", "turns": [{"tokens": 30, "max_tokens": 2}]}) + "\n")
    assert count_tokens(load_workload(old).session(0, 0).turns[0].content) == 30
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "a", "turns": [{"tokens": 30, "hash_ids": [1], "block_size": 16, "max_tokens": 2}]}) + "\n")
    with pytest.raises(WorkloadError, match=r"bad.jsonl line 1: turns\[0\].hash_ids: 1 blocks but tokens 30 needs 2"):
        load_workload(bad)
    nosize = tmp_path / "nosize.jsonl"
    nosize.write_text(json.dumps({"id": "a", "turns": [{"tokens": 30, "hash_ids": [1, 2], "max_tokens": 2}]}) + "\n")
    with pytest.raises(WorkloadError, match=r"nosize.jsonl line 1: turns\[0\].block_size: missing"):
        load_workload(nosize)


# --- the same format names in every command ---------------------------------------------------------


def test_format_names_mean_the_same_in_run_inspect_and_export(tmp_path):
    runner = CliRunner()
    for fmt, path, n in (("burstgpt", BURSTGPT, 8), ("bailian", BAILIAN, 4), ("mooncake", MOONCAKE_AIPERF, 4)):
        # run's loading path
        assert load_workload_named(str(path), fmt, {}).kind == fmt
        r = runner.invoke(main, ["workload", "inspect", str(path), "--workload-format", fmt, "--json"])
        assert r.exit_code == 0, r.output
        assert json.loads(r.output)["workload"]["kind"] == fmt
        out = tmp_path / f"{fmt}.jsonl"
        r = runner.invoke(main, ["workload", "export", str(path), "--format", fmt, "-o", str(out), "--counts-only"])
        assert r.exit_code == 0, r.output
        assert len(out.read_text().splitlines()) == n
    r = runner.invoke(main, ["workload", "inspect", str(BURSTGPT), "--workload-options", "model=ChatGPT"])
    assert r.exit_code == 0 and "left out" in r.output and "by model" in r.output


def test_a_bailian_file_as_an_arrival_trace_is_in_seconds():
    from workloads.arrivals import trace

    offsets = trace(BAILIAN)
    stamps = sorted(json.loads(x)["timestamp"] for x in BAILIAN.read_text().splitlines())
    assert np.allclose(offsets, np.array(stamps) - stamps[0])  # 61 s stays 61 s, not 61 ms
    assert np.allclose(trace(MOONCAKE)[:2], [0, (6420 - 458) / 1000])


def test_mooncake_rows_without_hash_ids_claim_no_prefix_reuse():
    wl = load_workload(MOONCAKE_AIPERF)
    assert "prefix_reuse" not in wl.stats
    r = CliRunner().invoke(main, ["workload", "inspect", str(MOONCAKE_AIPERF)])
    assert r.exit_code == 0 and "prefix reuse" not in r.output
