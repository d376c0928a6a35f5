"""Multi-turn Mooncake traces (AIPerf's ``mooncake_trace`` with ``session_id`` and ``delay``): the
reader's grouping, and ``workload anonymize --anonymize-format mooncake`` read back."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from loadgen.cli import main
from workloads import load_workload
from workloads.anonymize import FORMAT_MOONCAKE, AnonymizeCounts, write_anonymized
from workloads.errors import WorkloadError
from workloads.readers import get_reader
from workloads.streamed import StreamedTraceWorkload
from workloads.tokenizer import count_tokens

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "datasets"
SALT = bytes(range(16))


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _blocks(wl, k: int) -> list[list[list[int]]]:
    return [t["blocks"] for t in wl.record(k)["turns"]]


ROWS = [
    {"session_id": "a", "timestamp": 1000, "input_length": 6, "output_length": 3, "hash_ids": [1, 2]},
    {"session_id": "a", "delay": 250, "input_length": 5, "output_length": 0, "hash_ids": [3, 4]},
    {"timestamp": 1500, "input_length": 4, "output_length": 2, "hash_ids": [1]},  # no key: one request
    {"session_id": "b", "timestamp": 2000, "input_length": 4, "output_length": 2, "hash_ids": [9]},
    {"session_id": "b", "timestamp": 2600, "input_length": 8, "output_length": 2, "hash_ids": [10, 11]},
]


def test_rows_with_a_session_id_are_one_sessions_turns_in_file_order(tmp_path):
    path = _write(tmp_path / "t.jsonl", ROWS)
    wl = load_workload(path, options={"block_size": "4"})
    assert wl.num_sessions == 3
    assert list(wl.arrival_offsets()) == pytest.approx([0.0, 0.5, 1.0])
    a, single, b = (wl.session(0, k) for k in range(3))
    assert (a.session_id, single.session_id, b.session_id) == ("a", "t-L3", "b")
    assert [t.max_tokens for t in a.turns] == [3, 1] and [t.think_time_s for t in a.turns] == pytest.approx([0.0, 0.25])
    assert _blocks(wl, 0) == [[[1, 4], [2, 2]], [[3, 4], [4, 1]]]  # each turn's own blocks, its new message
    assert len(single.turns) == 1 and _blocks(wl, 1) == [[[1, 4]]]
    # without delay, a follow-up's think time is the gap between its timestamp and the line before's
    assert [t.think_time_s for t in b.turns] == pytest.approx([0.0, 0.6])
    assert [count_tokens(t.content) for t in b.turns] == [4, 8]
    assert wl.stats["prefix_reuse"] == pytest.approx(4 / 27)  # the single request's block 1 is session a's
    streamed = StreamedTraceWorkload(get_reader("mooncake"), path, {"block_size": "4"})  # as a large file is read
    got = [(r.lineno, r.time_s, r.record["turns"]) for r in streamed.rows()]
    assert got == [(1, 1.0, wl.record(0)["turns"]), (3, 1.5, wl.record(1)["turns"]), (4, 2.0, wl.record(2)["turns"])]
    assert [streamed.record_session(0, k, r.record) for k, r in enumerate(streamed.rows())] == [a, single, b]


def test_rows_without_a_session_id_are_one_request_each_as_before(tmp_path):
    wl = load_workload(FIX / "mooncake.jsonl")
    lines = (FIX / "mooncake.jsonl").read_text().splitlines()
    assert wl.num_sessions == len(lines) == 240
    assert all(len(r["turns"]) == 1 for r in (wl.record(k) for k in range(wl.num_sessions)))
    first = json.loads(lines[0])
    assert wl.record(0)["id"] == "mooncake-L1" and [b for b, _ in _blocks(wl, 0)[0]] == first["hash_ids"]
    aiperf = load_workload(FIX / "mooncake_aiperf.jsonl")
    assert aiperf.num_sessions == len((FIX / "mooncake_aiperf.jsonl").read_text().splitlines())


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([ROWS[0], ROWS[3], ROWS[1]], 'line 3: session_id "a": its lines stop before this one'),
        ([{**ROWS[0], "delay": 5}], 'line 1: delay: given on session "a"\'s first line'),
        ([{**ROWS[2], "delay": 5}], "line 1: delay: given without session_id"),
        ([ROWS[0], {**ROWS[1], "delay": -1}], "line 2: delay: -1 is not allowed"),
        ([ROWS[3], {**ROWS[4], "timestamp": 1000}], "line 2: timestamp: earlier than the session's line before"),
    ],
)
def test_a_bad_multi_turn_trace_is_a_one_line_error(tmp_path, rows, message):
    with pytest.raises(WorkloadError, match=re.escape(message)):
        load_workload(_write(tmp_path / "t.jsonl", rows), options={"block_size": "4"})


def test_anonymised_mooncake_rows_read_back_as_the_sessions(tmp_path):
    src = FIX / "bailian.jsonl"  # chats: multi-turn sessions with think times and arrivals
    wl = load_workload(src)
    out = tmp_path / "anon.jsonl"
    counts = AnonymizeCounts()
    assert write_anonymized(wl, 0, None, out, block_size=16, salt=SALT, form=FORMAT_MOONCAKE, counts=counts) == wl.num_sessions
    assert counts.flattened == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(set(r) <= {"session_id", "timestamp", "delay", "input_length", "output_length", "hash_ids"} for r in rows)
    assert len(rows) == sum(len(wl.session(0, k).turns) for k in range(wl.num_sessions))
    # each turn's ids are the session form's, which chain on from the turn before
    sessions_form = tmp_path / "anon-sessions.jsonl"
    write_anonymized(wl, 0, None, sessions_form, block_size=16, salt=SALT)
    want = [t["hash_ids"] for line in sessions_form.read_text().splitlines() for t in json.loads(line)["turns"]]
    assert [r["hash_ids"] for r in rows] == want
    back = load_workload(out, options={"block_size": "16"})
    assert back.num_sessions == wl.num_sessions
    assert list(back.arrival_offsets()) == pytest.approx(list(wl.arrival_offsets()), abs=1e-6)
    for k in range(wl.num_sessions):
        s, a = wl.session(0, k), back.session(0, k)
        assert a.session_id == f"anon-{k:06d}"
        assert [t.max_tokens for t in a.turns] == [t.max_tokens for t in s.turns]
        assert [t.think_time_s for t in a.turns] == pytest.approx([t.think_time_s for t in s.turns], abs=1e-6)
        sizes = [count_tokens(t.content) for t in s.turns]
        sizes[0] += count_tokens(s.system_prompt)
        assert [sum(n for _, n in t["blocks"]) for t in back.record(k)["turns"]] == sizes


def test_the_mooncake_form_holds_no_text_and_counts_flattened_fan_outs(tmp_path):
    src = FIX / "sharegpt.json"
    out = tmp_path / "anon.jsonl"
    r = CliRunner().invoke(main, ["workload", "anonymize", str(src), "--anonymize-format", "mooncake", "-o", str(out)])
    assert r.exit_code == 0 and "as Mooncake rows" in r.output, r.output
    written = out.read_text().lower()
    wl = load_workload(src)
    words = {w.lower() for k in range(wl.num_sessions) for t in wl.session(0, k).turns for w in re.findall(r"[A-Za-z]{4,}", t.content)}
    keys = {"session_id", "anon", "timestamp", "delay", "input_length", "output_length", "hash_ids"}
    assert words and not {w for w in words if w in written and not any(w in k for k in keys)}
    fan = tmp_path / "fan.jsonl"
    r = CliRunner().invoke(main, ["workload", "anonymize", "agentic-fanout", "-n", "3", "--anonymize-format", "mooncake", "-o", str(fan)])
    assert r.exit_code == 0, r.output
    assert re.search(r"^3 of them have sub-agents \(fan-out\), written flattened", r.output, re.M), r.output
    src_wl, back = load_workload("agentic-fanout"), load_workload(fan)
    assert [len(back.session(0, k).turns) for k in range(3)] == [len(src_wl.session(0, k).turns) for k in range(3)]
