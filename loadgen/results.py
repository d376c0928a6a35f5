"""The results directory, written incrementally so that a killed run keeps what it recorded.

``run.json`` is written when the run starts and rewritten (atomically: temp file + rename) when it
ends; ``requests.jsonl`` is appended and flushed at least every second; ``metrics.hlog`` gets one
interval line per histogram tag per flush. A run killed at any moment leaves ``run.json`` with
status ``running`` and everything up to the last flush: ``loadgen report`` says it is partial.
Only the master (or the single local process) writes here.
"""

from __future__ import annotations

import os
import platform
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from hdrh.histogram import HdrHistogram

from analysis import hlog
from analysis.records import (
    METRICS_FILE,
    REQUESTS_FILE,
    RUN_FILE,
    RUN_RUNNING,
    SCHEMA_VERSION,
    RequestRecord,
)


def _iso(t_unix_s: float) -> str:
    return datetime.fromtimestamp(t_unix_s, UTC).isoformat(timespec="milliseconds")


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in ("loadgen", "locust", "hdrhistogram"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "unknown"
    return out


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
    os.replace(tmp, path)


class ResultsWriter:
    """Owns ``results/<run-id>/`` for one run."""

    def __init__(self, run_dir: str | Path, run_info: dict[str, Any], t0_unix_s: float) -> None:
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.t0_unix_s = t0_unix_s
        self.run_info: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "status": RUN_RUNNING,
            "started_at": _iso(t0_unix_s),
            "t0_unix_s": t0_unix_s,
            "versions": versions(),
            **run_info,
        }
        write_json_atomic(self.dir / RUN_FILE, self.run_info)
        self._requests = open(self.dir / REQUESTS_FILE, "ab")  # noqa: SIM115 (held open for the run)
        self._hlog = hlog.HlogWriter(self.dir / METRICS_FILE, start_time_unix_s=t0_unix_s)
        self.records_written = 0
        self._closed = False

    def append_records(self, records: list[RequestRecord]) -> None:
        if not records:
            return
        self._requests.write(b"".join(orjson.dumps(r.to_dict()) + b"\n" for r in records))
        self.records_written += len(records)

    def write_intervals(self, histograms: dict[str, HdrHistogram], start_unix_s: float, end_unix_s: float) -> None:
        for tag in sorted(histograms):
            self._hlog.write_interval(
                histograms[tag], tag=tag, start_s=start_unix_s - self.t0_unix_s, length_s=end_unix_s - start_unix_s
            )

    def flush_records(self) -> None:
        if not self._closed:
            self._requests.flush()

    def flush(self) -> None:
        if self._closed:
            return
        # flush() hands the bytes to the kernel: they survive a kill -9 of this process.
        self._requests.flush()
        self._hlog.flush()

    def update_run(self, **fields: Any) -> None:
        self.run_info.update(fields)
        write_json_atomic(self.dir / RUN_FILE, self.run_info)

    def finish(self, status: str, **fields: Any) -> None:
        self.flush()
        self.update_run(status=status, ended_at=_iso(time.time()), **fields)
        self._requests.close()
        self._hlog.close()
        self._closed = True
