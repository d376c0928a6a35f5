"""A worker pulling the master's streamed trace: chunks in any order make the file; a stall or a
changed file is a one-line error (the end-to-end pull: tests/integration/test_trace_scale.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

import loadgen.runtime.file_ship as ship
from loadgen.errors import UserError
from loadgen.runtime.file_ship import MSG_FILE_PULL, FileFetch, read_chunk


def serving(source: Path, fetch_box: list, *, reverse: bool = False, drop_after: int | None = None, shrink: bool = False):
    """A master that answers each pull from ``source`` (the answers delivered in reverse order of
    the window, duplicated, or stopped after ``drop_after`` pulls)."""
    pulls: list[int] = []
    held: list[dict] = []

    def send(msg_type: str, data: dict) -> None:
        assert msg_type == MSG_FILE_PULL
        pulls.append(data["offset"])
        if drop_after is not None and len(pulls) > drop_after:
            return
        chunk = read_chunk(str(source), data["offset"])
        if shrink:
            chunk = chunk[:-1]
        answer = {"run_id": "r", "offset": data["offset"], "data": chunk}
        if reverse and len(pulls) <= ship.WINDOW:  # the first window's answers come last first
            held.insert(0, answer)
            if len(pulls) < ship.WINDOW:
                return
        for a in held or [answer]:
            fetch_box[0].on_chunk({"run_id": "other", "offset": 0, "data": b"x"})  # another run's: ignored
            fetch_box[0].on_chunk(a)
            fetch_box[0].on_chunk(a)  # a duplicate changes nothing
        held.clear()

    return send, pulls


def test_chunks_in_any_order_make_the_file_with_a_bounded_window(tmp_path, monkeypatch):
    monkeypatch.setattr(ship, "CHUNK_BYTES", 1000)
    source = tmp_path / "azure.csv"
    source.write_bytes(bytes(range(256)) * 40 + b"tail")  # 10,244 bytes: 11 chunks, the last short
    box: list = []
    send, pulls = serving(source, box, reverse=True)
    box.append(FileFetch(send, "r", str(source), source.stat().st_size))
    path = box[0].run()
    assert Path(path).name == "azure.csv" and Path(path).read_bytes() == source.read_bytes()
    assert sorted(pulls) == list(range(0, 10_244, 1000))  # each chunk asked for once


def test_a_stalled_master_or_a_changed_file_is_a_one_line_error(tmp_path, monkeypatch):
    monkeypatch.setattr(ship, "CHUNK_BYTES", 100)
    monkeypatch.setattr(ship, "CHUNK_TIMEOUT_S", 0.05)
    source = tmp_path / "t.csv"
    source.write_bytes(b"x" * 1000)
    box: list = []
    send, _ = serving(source, box, drop_after=6)
    box.append(FileFetch(send, "r", "t.csv", 1000))
    with pytest.raises(UserError, match=r"pulling the trace from the master stalled with 4 of its 10 chunks still to come; copy it"):
        box[0].run()
    box.clear()
    send, _ = serving(source, box, shrink=True)
    box.append(FileFetch(send, "r", "t.csv", 1000))
    with pytest.raises(UserError, match=r"the master's trace changed while this worker pulled it \(chunk at 0\)"):
        box[0].run()


def test_a_pull_cancelled_by_the_runs_end_stops_at_once(tmp_path, monkeypatch):
    monkeypatch.setattr(ship, "CHUNK_BYTES", 100)
    monkeypatch.setattr(ship, "CHUNK_TIMEOUT_S", 30.0)  # a stall would hold the test: cancel must not wait for it
    source = tmp_path / "t.csv"
    source.write_bytes(b"x" * 1000)
    box: list = []
    send, _ = serving(source, box, drop_after=3)
    box.append(FileFetch(send, "r", "t.csv", 1000))
    box[0].cancel()
    with pytest.raises(UserError, match=r"the run ended before the trace was pulled from the master"):
        box[0].run()
