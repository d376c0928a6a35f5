"""Session files streamed line by line give what the whole-file reader gives.

The session files are written from the shipped specs and fixtures (``write_sessions_jsonl``:
texts, token counts, prefix blocks, DAG steps, arrival times); ``StreamedTraceWorkload`` is built
on them directly, as a run builds it for a file of STREAM_MIN_BYTES or more.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from workloads import load_workload
from workloads.errors import WorkloadError
from workloads.loader import is_streamed_file
from workloads.readers import get_reader
from workloads.sessions_jsonl import write_sessions_jsonl
from workloads.streamed import STREAM_MIN_BYTES, StreamedTraceWorkload

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "datasets"
# (source, format or None for a shipped spec, sessions, with texts)
SOURCES = [
    ("chat", None, 12, True),
    ("agentic-fanout", None, 6, False),
    (str(FIX / "mooncake.jsonl"), "mooncake", 20, False),
    (str(FIX / "bailian.jsonl"), "bailian", 5, False),
    (str(FIX / "sharegpt.json"), "sharegpt", 4, True),
]


def streamed(path: Path) -> StreamedTraceWorkload:
    return StreamedTraceWorkload(get_reader("sessions"), path, {})


@pytest.mark.parametrize(("source", "fmt", "n", "text"), SOURCES)
def test_streamed_session_file_is_the_whole_file_readers_sessions(tmp_path, source, fmt, n, text):
    src = load_workload(source, fmt=fmt)
    n = min(n, src.num_sessions or n)
    path = write_sessions_jsonl(src, 3, n, tmp_path / "s.jsonl", include_text=text)
    whole = load_workload(path)
    wl = streamed(path)
    rows = list(wl.rows())
    assert len(rows) == whole.num_sessions == wl.num_sessions == n
    for k, row in enumerate(rows):
        assert wl.record_session(3, k, row.record) == whole.session(3, k)
        assert wl.session(3, k) == whole.session(3, k)
    offsets = whole.arrival_offsets()
    if offsets is None:
        assert not wl.has_arrival_times() and all(r.time_s is None for r in rows)
    else:
        times = np.array([r.time_s for r in rows])
        assert wl.has_arrival_times() and np.allclose(times - times[0], offsets, rtol=0, atol=1e-9)


def _line(i: int, arrival: float | None = None) -> str:
    rec: dict = {"id": f"s{i}", "turns": [{"tokens": 10 + i, "max_tokens": 4}]}
    if arrival is not None:
        rec["arrival_s"] = arrival
    return json.dumps(rec) + "\n"


def test_a_streamed_session_earlier_than_the_one_before_is_an_error_naming_its_line(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text(_line(0, 0.0) + _line(1, 2.0) + "\n" + _line(2, 1.5))
    assert load_workload(path).num_sessions == 3  # read whole, it is sorted
    with pytest.raises(WorkloadError, match=r"s\.jsonl line 4: timestamp is 0\.5 s before line 2's; .*time order"):
        list(streamed(path).rows())


@pytest.mark.parametrize(("first", "later", "said"), [(0.0, None, "has no arrival_s"), (None, 1.0, "has arrival_s")])
def test_a_streamed_session_file_with_arrival_s_on_some_lines_is_an_error_naming_the_line(tmp_path, first, later, said):
    path = tmp_path / "s.jsonl"
    path.write_text(_line(0, first) + _line(1, later))
    with pytest.raises(WorkloadError, match=rf"s\.jsonl line 2: session 's1' {said} but line 1's"):
        list(streamed(path).rows())


def test_a_streamed_repeated_id_names_both_lines(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text(_line(0) + _line(1) + _line(0))
    with pytest.raises(WorkloadError, match=r"line 3: id: \"s0\" already used on line 1"):
        list(streamed(path).rows())


def test_a_large_session_file_streams_its_first_sessions_without_reading_it_whole(tmp_path):
    """The file's last line is broken: the whole-file reader stops on it, the stream gives its first
    sessions without reaching it, and names it only when read that far."""
    path = tmp_path / "big.jsonl"
    pad = "x" * 8000  # long lines: the file is large but few lines, so reading it whole is quick
    n = STREAM_MIN_BYTES // len(pad) + 10
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"s{i}", "arrival_s": i * 0.01, "turns": [{"content": pad, "max_tokens": 4}]}) + "\n")
        f.write('{"id": "broken", "turns": [\n')
    assert path.stat().st_size >= STREAM_MIN_BYTES and is_streamed_file(path)
    wl = load_workload(path, stream=True)
    assert isinstance(wl, StreamedTraceWorkload) and wl.has_arrival_times()
    first = [wl.session(1, k) for k in range(5)]
    assert [s.session_id for s in first] == [f"s{k}" for k in range(5)]
    assert wl.sessions_available(at_most=100) == 100
    with pytest.raises(WorkloadError, match=rf"big\.jsonl line {n + 1}: not valid JSON"):
        load_workload(path)
