"""The results directory, written incrementally so that a killed run keeps what it recorded.

``run.json`` is written when the run starts and rewritten (atomically: temp file + rename) when it
ends; ``requests.jsonl`` is appended and flushed at least every second; ``metrics.hlog`` gets one
interval line per histogram tag per flush. A run killed at any moment leaves ``run.json`` with
status ``running`` and everything up to the last flush: ``loadgen report`` says it is partial.
Only the master (or the single local process) writes here.

A write that fails mid-run (disk full, file system remounted read-only) never raises: the writer
keeps the first failure in ``failed``, writes nothing more, and the run stops on it. What reached
the disk before stays readable (a cut last line of requests.jsonl is dropped by the reader).
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
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
from loadgen.errors import UserError


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
    try:
        tmp.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)  # the old file stays whole; no half-written temp beside it
        raise


def check_writable(results_dir: str | Path) -> None:
    """Before any load: a one-line UserError when ``results_dir`` cannot take a run's files.

    Creates the directory and writes (then removes) a small probe file, so a read-only file
    system, a missing permission and a full disk are all found before the target sees a request.
    """
    path = Path(results_dir)
    probe = path / f".loadgen-write-check-{os.getpid()}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as f:
            f.write(b"\0" * 65536)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise UserError(
            f"--results {results_dir}: cannot write there ({e.strerror or e}); "
            "give a writable directory with free space"
        ) from None
    finally:
        try:
            probe.unlink(missing_ok=True)
        except OSError:
            pass


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
        self.failed: str | None = None  # the first write failure, in words; nothing is written after it

    def _attempt(self, write: Callable[[], Any]) -> bool:
        """Run one write; on an OSError keep it in ``failed``, close the files, write no more."""
        if self._closed:
            return False
        try:
            write()
        except OSError as e:
            self._fail(e)
            return False
        return True

    def _fail(self, error: OSError) -> None:
        self.failed = f"cannot write results in {self.dir}: {error.strerror or error}"
        self._close_files()

    def _close_files(self) -> None:
        if self._closed:
            return
        self._closed = True
        for f in (self._requests, self._hlog):
            try:
                f.close()
            except OSError:
                pass  # its buffer could not reach the disk either: the failure is already kept

    def append_records(self, records: list[RequestRecord]) -> None:
        if not records:
            return
        data = b"".join(orjson.dumps(r.to_dict()) + b"\n" for r in records)
        if self._attempt(lambda: self._requests.write(data)):
            self.records_written += len(records)

    def write_intervals(self, histograms: dict[str, HdrHistogram], start_unix_s: float, end_unix_s: float) -> None:
        def write() -> None:
            for tag in sorted(histograms):
                self._hlog.write_interval(
                    histograms[tag], tag=tag, start_s=start_unix_s - self.t0_unix_s, length_s=end_unix_s - start_unix_s
                )

        self._attempt(write)

    def flush_records(self) -> None:
        self._attempt(self._requests.flush)

    def flush(self) -> None:
        # flush() hands the bytes to the kernel: they survive a kill -9 of this process.
        self._attempt(self._requests.flush)
        self._attempt(self._hlog.flush)

    def update_run(self, **fields: Any) -> None:
        self.run_info.update(fields)
        if self.failed is None:
            try:
                write_json_atomic(self.dir / RUN_FILE, self.run_info)
            except OSError as e:
                self._fail(e)

    def finish(self, status: str, **fields: Any) -> None:
        self.flush()
        self.update_run(status=status, ended_at=_iso(time.time()), **fields)
        if not self._closed:
            self._closed = True
            self._requests.close()
            self._hlog.close()
