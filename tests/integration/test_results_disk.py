"""A results directory that cannot be written: refused before load, or the run stops cleanly mid-way.

The file systems are real: small tmpfs mounts (read-only, or filled up while the run writes), so
this needs root to mount. Elsewhere it is skipped, saying why, unless ``CI`` is set: CI runs as
root, so there a tmpfs that cannot be mounted is a failure, never a silent skip.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson
import pytest

from analysis.results import read_requests
from loadgen.errors import UserError
from loadgen.runtime.results_writer import check_writable

from .runs import LOADGEN, loadgen, sim, truth

pytestmark = pytest.mark.slow


def _on_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@contextmanager
def _tmpfs(path: Path, options: str) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True)
    if r.returncode != 0:
        why = f"cannot mount a tmpfs here ({r.stderr.strip() or r.returncode}); needs root allowed to mount (this is uid {os.geteuid()})"
        if _on_ci():
            pytest.fail(f"{why}, and CI is set: CI runs the tests as root, so this must not be skipped there")
        pytest.skip(f"{why}; skipped off CI only (with CI set this fails)")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def _fill(path: Path) -> None:
    """Take every free byte of the file system under ``path``."""
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError:
            pass
        try:  # the last, partial block too
            while True:
                f.write(b"\0" * 512)
        except OSError:
            pass


def test_an_unwritable_results_directory_is_refused_before_load(tmp_path) -> None:
    # The target is never contacted: the check comes before the fleet and the preflight.
    target = ("--target", "http://127.0.0.1:9", "--workload", "tiny", "--num-sessions", "1")
    with _tmpfs(tmp_path / "ro", "size=1m,ro") as ro:
        r = loadgen("run", *target, "--results", str(ro / "results"), timeout_s=60)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == (
        f"Error: --results {ro / 'results'}: cannot write there (Read-only file system); "
        "give a writable directory with free space"
    )
    with _tmpfs(tmp_path / "full", "size=256k") as full:
        _fill(full / "filler")
        with pytest.raises(UserError) as e:  # the same check, in-process: one CLI start is enough
            check_writable(full / "results")
        assert e.value.message.endswith("cannot write there (No space left on device); give a writable directory with free space")
        assert not list((full / "results").glob("*"))  # no probe left behind


def test_a_disk_that_fills_mid_run_stops_the_run_with_exit_5_and_keeps_what_was_written(tmp_path) -> None:
    with sim(tmp_path, "--profile", "h200-llama3-8b-fp8", "--seed", "1") as (proc, truth_log), _tmpfs(
        tmp_path / "disk", "size=4m"
    ) as disk:
        results = disk / "results"
        p = subprocess.Popen(
            [*LOADGEN, "run", "--target", proc.url, "--workload", "tiny", "--rate", "10", "--duration", "60s",
             "--seed", "1", "--results", str(results), "--run-id", "full", "--max-schedule-lag", "30s"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        try:
            run_dir = results / "full"
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and len(_lines(run_dir / "requests.jsonl")) < 20:
                time.sleep(0.1)
            assert len(_lines(run_dir / "requests.jsonl")) >= 20, "the run wrote no records"
            _fill(disk / "filler")
            t_full = time.monotonic()
            _, err = p.communicate(timeout=40)
            stopped_s = time.monotonic() - t_full
        finally:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
        assert p.returncode == 5, err[-3000:]
        assert f"Error: cannot write results in {run_dir}: No space left on device; stopping the run" in err
        verdict = err.strip().splitlines()[-1]
        assert verdict.startswith(f"loadgen verdict: FAIL (exit 5): run incomplete: cannot write results in {run_dir}")
        assert "Traceback" not in err
        assert stopped_s < 35  # the stop drains requests on the wire (--stop-timeout 30s), no more

        # What was written stays readable; with room again, it reports as a partial run.
        info = orjson.loads((run_dir / "run.json").read_bytes())
        assert info["status"] == "running"
        recs = read_requests(run_dir / "requests.jsonl")
        assert len(recs) >= 20 and len({r.request_id for r in recs}) == len(recs)
        assert {r.request_id for r in recs} <= set(truth(truth_log))
        (disk / "filler").unlink()
        r = loadgen("report", str(run_dir))
        assert r.returncode == 0, r.stderr
        assert "partial" in r.stdout.lower()


def _lines(path: Path) -> list[bytes]:
    try:
        return path.read_bytes().splitlines()
    except FileNotFoundError:
        return []
