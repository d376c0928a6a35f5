"""A large session file and a large Qwen-Bailian trace replayed as they are read (real sim, real
Locust master and two workers): the sessions are the file's first ones, at their times, each
turn sent once."""

from __future__ import annotations

import itertools
import json
import subprocess
from pathlib import Path

import pytest

from tests.integration.runs import LOADGEN, records, run_dir, sim
from workloads import load_workload
from workloads.loader import is_streamed_file
from workloads.streamed import STREAM_MIN_BYTES, StreamedTraceWorkload

SESSIONS = 6
PAD = "x" * 6000  # long lines: a file past the streaming size in ~1,400 lines


def write_sessions(path: Path) -> None:
    with open(path, "w") as f:
        i = 0
        while f.tell() < STREAM_MIN_BYTES + 4096:
            turns = [{"content": f"q{i} {PAD}", "max_tokens": 4}, {"tokens": 20, "max_tokens": 3, "think_time": 0.05}]
            f.write(json.dumps({"id": f"s{i}", "arrival_s": 100 + i * 0.05, "turns": turns}) + "\n")
            i += 1


def write_bailian(path: Path) -> None:
    """Chats 0.05 s apart, each a first turn and a follow-up 0.1 s after it (two chats later)."""
    with open(path, "w") as f:
        n = 0
        while f.tell() < STREAM_MIN_BYTES + 4096:
            t = round(n * 0.05, 3)
            f.write(json.dumps({"chat_id": 2 * n + 1, "parent_chat_id": -1, "timestamp": t, "input_length": 40,
                                "output_length": 4, "type": PAD}) + "\n")  # fmt: skip
            if n >= 2:
                f.write(json.dumps({"chat_id": 2 * n - 2, "parent_chat_id": 2 * n - 3, "timestamp": t,
                                    "input_length": 64, "output_length": 3, "type": PAD}) + "\n")  # fmt: skip
            n += 1


@pytest.mark.parametrize(
    ("fmt", "write", "options", "ids"),
    [
        ("sessions", write_sessions, None, [f"s{k}" for k in range(SESSIONS)]),
        ("bailian", write_bailian, "chat_horizon=2s", [f"big-c{2 * k + 1}" for k in range(SESSIONS)]),
    ],
)
def test_a_large_file_of_multi_turn_sessions_is_replayed_as_it_is_read(tmp_path, fmt, write, options, ids):
    path = tmp_path / "big.jsonl"
    write(path)
    assert is_streamed_file(path)
    results = tmp_path / "results"
    with sim(tmp_path, "--profile", "h200-llama3-8b-fp8", "--time-scale", "0") as (proc, _):
        cmd = [
            *LOADGEN, "run", "--target", proc.url, "--workload", str(path), "--num-sessions", str(SESSIONS),
            "--workers", "2", "--max-schedule-lag", "1s", "--results", str(results),
        ]  # fmt: skip
        if options:
            cmd += ["--workload-options", options]
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    info = json.loads((run_dir(results) / "run.json").read_text())
    streamed = load_workload(path, stream=True, options=options)
    assert isinstance(streamed, StreamedTraceWorkload)
    # The file's bytes hashed, as a streamed replay hashes them (a whole read hashes its records).
    assert (info["workload"]["kind"], info["workload"]["fingerprint"]) == (fmt, streamed.fingerprint())
    recs = sorted(records(run_dir(results)), key=lambda r: (r.session_index, r.turn_index))
    assert all(r.ok for r in recs) and len({r.worker for r in recs}) == 2
    assert [(r.session_index, r.turn_index) for r in recs] == [(k, t) for k in range(SESSIONS) for t in (0, 1)]
    assert [r.session_id for r in recs[::2]] == ids
    firsts = [r.t_sched_us / 1e6 for r in recs[::2]]  # the sessions 0.05 s apart, as the file has them
    assert all(abs(b - a - 0.05) <= 2e-6 for a, b in itertools.pairwise(firsts)), firsts
    for first, follow in zip(recs[::2], recs[1::2], strict=True):  # the follow-up carries the history
        assert follow.max_tokens == 3 and follow.prompt_tokens > first.prompt_tokens
