"""A results directory that fails mid-run: the writer keeps the failure and never raises."""

from __future__ import annotations

import os

import orjson
import pytest

from analysis.records import RequestRecord
from loadgen.errors import UserError
from loadgen.runtime.results_writer import ResultsWriter, check_writable


def _record(i: int) -> RequestRecord:
    return RequestRecord(
        request_id=f"r-{i}-0", session_id=f"s{i}", session_index=i, turn_index=0, turn_class="first",
        tenant="default", target="t", worker="w", status="ok", t_sched_us=0, t_send_us=1,
    )  # fmt: skip


def test_a_full_disk_is_kept_as_the_failure_and_nothing_raises(tmp_path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # /dev/full: every write that reaches it fails with ENOSPC, as on a full file system.
    os.symlink("/dev/full", run_dir / "requests.jsonl")
    w = ResultsWriter(run_dir, {"config": {}}, t0_unix_s=1.0)
    assert w.failed is None
    w.append_records([_record(i) for i in range(3)])  # buffered: not on the disk yet
    w.flush_records()
    assert w.failed == f"cannot write results in {run_dir}: No space left on device"
    w.append_records([_record(3)])
    w.update_run(workers=[])
    w.flush()
    w.finish("complete", requests_recorded=4)  # no exception, and no half-written run.json
    info = orjson.loads((run_dir / "run.json").read_bytes())
    assert info["status"] == "running" and "workers" not in info
    assert not (run_dir / "run.json.tmp").exists()


def test_check_writable_names_the_directory_and_the_reason(tmp_path) -> None:
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(UserError) as e:
        check_writable(tmp_path / "a-file" / "results")
    assert e.value.message == (
        f"--results {tmp_path / 'a-file' / 'results'}: cannot write there (Not a directory); "
        "give a writable directory with free space"
    )
    check_writable(tmp_path / "ok" / "results")
    assert list((tmp_path / "ok" / "results").iterdir()) == []  # the probe is gone
