"""Helpers for end-to-end tests: a real sim with a truth log, and `loadgen` as a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson

from analysis.records import RequestRecord
from targets.sim.process import SimProcess

LOADGEN = [sys.executable, "-m", "loadgen"]


@contextmanager
def sim(tmp_path: Path, *args: str) -> Iterator[tuple[SimProcess, Path]]:
    """A sim on 127.0.0.1 with ``--truth-log``; always stopped."""
    truth = tmp_path / f"truth-{len(list(tmp_path.glob('truth-*')))}.jsonl"
    proc = SimProcess.start([*args, "--truth-log", str(truth)])
    try:
        yield proc, truth
    finally:
        proc.stop()


def loadgen(*args: str, timeout_s: float = 180.0, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*LOADGEN, *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )


def records(run_dir: Path) -> list[RequestRecord]:
    lines = (run_dir / "requests.jsonl").read_bytes().splitlines()
    return [RequestRecord.from_dict(orjson.loads(line)) for line in lines if line.strip()]


def truth(path: Path) -> dict[str, dict]:
    out = {}
    for line in path.read_bytes().splitlines():
        if line.strip():
            t = orjson.loads(line)
            out[t["request_id"]] = t
    return out


def run_dir(results: Path) -> Path:
    dirs = [d for d in results.iterdir() if d.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


def percentile(values: list[float], p: float) -> float:
    import numpy as np

    return float(np.percentile(np.asarray(values, dtype=float), p))
