"""Qwen-Bailian traces read as a stream: chats linked from time-ordered rows, only open chats held."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from workloads import load_workload
from workloads.errors import WorkloadError
from workloads.loader import is_streamed_file
from workloads.readers import get_reader
from workloads.streamed import STREAM_MIN_BYTES, StreamedTraceWorkload

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "datasets"


def streamed(path: Path, options: dict[str, str] | None = None) -> StreamedTraceWorkload:
    return StreamedTraceWorkload(get_reader("bailian"), path, options or {})


def sorted_fixture(tmp_path: Path) -> Path:
    """The shipped fixture with its rows in time order (stable: ties keep file order), as a
    streamed trace must be; its chats are the fixture's."""
    lines = [ln for ln in (FIX / "bailian.jsonl").read_text().splitlines() if ln.strip()]
    lines.sort(key=lambda ln: json.loads(ln)["timestamp"])
    path = tmp_path / "bailian.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_streamed_chats_are_the_whole_file_readers_sessions_and_offsets(tmp_path):
    path = sorted_fixture(tmp_path)
    whole = load_workload(FIX / "bailian.jsonl")
    wl = streamed(path)
    rows = list(wl.rows())
    assert len(rows) == whole.num_sessions == wl.num_sessions
    assert any(len(r.record["turns"]) > 1 for r in rows)  # chats of several turns are linked
    for k, row in enumerate(rows):
        assert wl.record_session(5, k, row.record) == whole.session(5, k)
    times = np.array([r.time_s for r in rows])
    assert np.array_equal(times - times[0], whole.arrival_offsets())


def _row(cid: int, parent: int, t: float, n_in: int = 32, pad: int = 0) -> str:
    obj = {"chat_id": cid, "parent_chat_id": parent, "timestamp": t, "input_length": n_in, "output_length": 4}
    if pad:
        obj["type"] = "x" * pad  # kept out of the replay: only makes the file large
    return json.dumps(obj) + "\n"


def test_a_turn_past_the_horizon_starts_a_session_of_its_own(tmp_path):
    path = tmp_path / "b.jsonl"
    path.write_text(_row(1, -1, 0.0) + _row(2, 1, 50.0, 64) + _row(3, 2, 200.0, 128) + _row(4, -1, 210.0))
    assert [len(r.record["turns"]) for r in streamed(path).rows()] == [3, 1]  # default: 30 min
    rows = list(streamed(path, {"chat_horizon": "100s"}).rows())
    assert [(r.lineno, len(r.record["turns"])) for r in rows] == [(1, 2), (3, 1), (4, 1)]
    assert rows[1].record["turns"][0]["tokens"] == 128  # its whole prompt, as an orphan's
    with pytest.raises(WorkloadError, match="chat_horizon='0' is not allowed"):
        list(streamed(path, {"chat_horizon": "0"}).rows())


def test_a_streamed_row_earlier_than_the_one_before_is_an_error_naming_its_line(tmp_path):
    path = tmp_path / "b.jsonl"
    path.write_text(_row(1, -1, 0.0) + _row(2, -1, 5.0) + _row(3, 1, 4.0))
    with pytest.raises(WorkloadError, match=r"b\.jsonl line 3: timestamp is 1 s before line 2's; .*time order"):
        list(streamed(path).rows())


def test_a_repeated_chat_id_of_an_open_chat_names_both_lines(tmp_path):
    path = tmp_path / "b.jsonl"
    path.write_text(_row(1, -1, 0.0) + _row(2, 1, 1.0) + _row(2, -1, 2.0))
    with pytest.raises(WorkloadError, match=r"line 3: chat_id: 2 already used on line 2"):
        list(streamed(path).rows())


def test_a_large_trace_hands_out_its_first_chats_without_reading_it_whole(tmp_path):
    """Chats 1 s apart, each of two turns 10 s apart, with a horizon of 60 s: the first chat comes
    out once the rows pass 70 s, long before the broken last line; reading it all names that line."""
    path = tmp_path / "big.jsonl"
    pad = 5000  # 5 KB a row: a large file of few rows, quick to read whole
    n = 0
    with open(path, "w") as f:
        while f.tell() < STREAM_MIN_BYTES + 4096:
            f.write(_row(2 * n + 1, -1, float(n), pad=pad))
            if n >= 10:
                f.write(_row(2 * (n - 10) + 2, 2 * (n - 10) + 1, float(n), pad=pad))
            n += 1
        f.write('{"chat_id": "broken", \n')
    assert is_streamed_file(path, "bailian")
    wl = load_workload(path, stream=True, options={"chat_horizon": "60s"})
    assert isinstance(wl, StreamedTraceWorkload)
    first = [wl.session(0, k) for k in range(3)]
    assert [s.session_id for s in first] == ["big-c1", "big-c3", "big-c5"]
    assert [len(s.turns) for s in first] == [2, 2, 2] and first[0].turns[1].think_time_s == 10.0
    with pytest.raises(WorkloadError, match=r"big\.jsonl line \d+: not valid JSON"):
        list(wl.rows())
