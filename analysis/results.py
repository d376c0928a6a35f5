"""Reading a results directory: ``run.json``, ``requests.jsonl`` and ``metrics.hlog`` (docs/results-format.md).

``load_results(run_dir)`` checks what a later step relies on and turns every problem a user can
meet into a one-line ``ResultsError`` naming the file and the fix. What a crash leaves behind is
tolerated and said: a truncated last line is dropped with a note, and a partial run (``status`` not
``complete``) may lack ``requests.jsonl`` or ``metrics.hlog``.

Times are relative to ``run.json: t0_unix_s``. The measurement window is [``warmup_s``,
``duration_s``): ``duration_s`` counts from the run's start, warm-up included, as ``--duration``
does. The *measured* requests are those intended (``t_sched``) at or after ``warmup_s``, drain
included; throughput counts the requests that *finished* inside the window (docs/metrics.md).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from hdrh.histogram import HdrHistogram

from analysis import hdr, hlog
from analysis.errors import ResultsError
from analysis.metric_registry import TURN_CLASS_FIRST, TURN_CLASS_FOLLOW_UP
from analysis.records import (
    HIST_HIGHEST_US,
    HIST_LOWEST_US,
    METRICS_FILE,
    REQUESTS_FILE,
    RUN_COMPLETE,
    RUN_FILE,
    SCHEMA_VERSION,
    RequestRecord,
    histogram_tag,
    request_values,
)

_REQUIRED_FIELDS = ("request_id", "session_id", "turn_index", "status", "t_sched_us", "t_send_us")


@dataclass(frozen=True, slots=True)
class Window:
    """The measurement window in seconds since the run's start.

    ``end_s`` is ``duration_s`` when run.json has it, else the last time any request finished (a
    run bounded by a session count). A run that stopped before ``duration_s`` (a partial run, or a
    complete one whose ``ended_at`` is earlier: every session done) also ends with its last request.
    ``end_source`` says which.
    """

    start_s: float
    end_s: float
    end_source: str  # "duration_s" | "last request"

    @property
    def length_s(self) -> float:
        return max(0.0, self.end_s - self.start_s)


@dataclass
class RunResults:
    """A loaded results directory. ``records`` are in file order; ``notes`` are for the reader."""

    path: Path
    info: dict[str, Any]
    records: list[RequestRecord]
    hlog: hlog.Hlog | None
    notes: list[str] = field(default_factory=list)

    @property
    def run_id(self) -> str:
        return str(self.info.get("run_id") or self.path.name)

    @property
    def status(self) -> str:
        return str(self.info.get("status") or "running")

    @property
    def partial(self) -> bool:
        return self.status != RUN_COMPLETE

    @property
    def partial_reason(self) -> str | None:
        if not self.partial:
            return None
        if self.status == "aborted":
            why = self.info.get("abort_reason") or self.info.get("error")
            return "the run was aborted" + (f": {why}" if why else "") + "; figures cover what was recorded"
        return (
            f"run.json status is {self.status!r}: the run is still going or ended without finishing "
            "(crash or kill); figures cover what was recorded up to the last flush"
        )

    @property
    def warmup_s(self) -> float:
        return float(self.info.get("warmup_s") or 0.0)

    @property
    def duration_s(self) -> float | None:
        d = self.info.get("duration_s")
        return None if d is None else float(d)

    @property
    def window(self) -> Window:
        last = max([self.warmup_s, *(record_end_us(r) / 1e6 for r in self.records)])
        if self.duration_s is None or self._stopped_before(self.duration_s, last):
            # No planned end, or a run that stopped before it (crash, or every session done):
            # rates over what was recorded.
            return Window(self.warmup_s, last, "last request")
        return Window(self.warmup_s, self.duration_s, "duration_s")

    def _stopped_before(self, duration_s: float, last_s: float) -> bool:
        if self.partial:
            return last_s < duration_s
        try:
            ended = datetime.fromisoformat(str(self.info["ended_at"])).timestamp() - float(
                self.info["t0_unix_s"]
            )
        except (KeyError, TypeError, ValueError):
            return False
        return ended < duration_s

    def measured(self) -> list[RequestRecord]:
        """The measured requests: intended (``t_sched``) at or after the end of warm-up.

        Requests of the drain after ``duration_s`` stay in: dropping the slowest requests of the
        window because they finished late would flatter an overloaded server.
        """
        start_us = self.warmup_s * 1e6
        return [r for r in self.records if r.t_sched_us >= start_us]

    def finished_in_window(self) -> list[RequestRecord]:
        """Requests that finished inside the window: the ones throughput and goodput count."""
        w = self.window
        lo, hi = w.start_s * 1e6, w.end_s * 1e6
        last = w.end_source == "last request"
        return [r for r in self.records if lo <= (t := record_end_us(r)) and (t < hi or (last and t <= hi))]

    def histograms(self) -> dict[str, HdrHistogram]:
        """``{tag: histogram}`` of the measured requests.

        From ``metrics.hlog`` when every request was measured (no warm-up); otherwise rebuilt
        exactly from the measured records with the runtime's own recording rule
        (``records.metric_values``): hlog intervals are cut by flush time, not by when a request
        was intended, so they cannot exclude warm-up.
        """
        if self.hlog is not None and not self._needs_rebuild():
            return self.hlog.histograms()
        return histograms_from_records(self.measured())

    def _needs_rebuild(self) -> bool:
        if self.hlog is None:
            return True
        start_us = self.warmup_s * 1e6
        return any(r.t_sched_us < start_us for r in self.records)

    @property
    def histogram_source(self) -> str:
        return "requests.jsonl" if self._needs_rebuild() else "metrics.hlog"


def load_results(run_dir: str | Path, *, histograms: bool = True) -> RunResults:
    """Read ``run_dir``; ``histograms=False`` skips ``metrics.hlog`` (compare needs only records)."""
    d = Path(run_dir)
    if not d.is_dir():
        raise ResultsError(f"{d}: no such results directory")
    info = read_run_info(d)
    partial = info.get("status") != RUN_COMPLETE
    notes: list[str] = []
    req_path = d / REQUESTS_FILE
    if req_path.exists():
        records = read_requests(req_path, notes=notes)
    elif partial:
        records = []
        notes.append(f"{REQUESTS_FILE} is missing: the run recorded no request before it stopped")
    else:
        raise ResultsError(
            f"{req_path}: no such file, but run.json says the run completed; the directory is incomplete"
        )
    log = None
    if histograms:
        hpath = d / METRICS_FILE
        if hpath.exists():
            log = hlog.read_hlog(hpath)
            notes.extend(log.notes)
        elif partial:
            notes.append(f"{METRICS_FILE} is missing: histograms rebuilt from {REQUESTS_FILE}")
        else:
            raise ResultsError(
                f"{hpath}: no such file, but run.json says the run completed; the directory is incomplete"
            )
    lost = info.get("lost_workers") or []
    if lost:
        notes.append(
            f"{len(lost)} worker(s) were lost during the run; their last unreported requests are missing"
        )
    missing = info.get("missing_final_reports") or []
    if missing:
        notes.append(
            f"no final report from worker(s) {', '.join(map(str, missing))}; their last records are missing"
        )
    return RunResults(d, info, records, log, notes)


def read_run_info(run_dir: str | Path) -> dict[str, Any]:
    """``run.json`` as a dict, after checking it is one this version understands."""
    path = Path(run_dir) / RUN_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ResultsError(f"{path}: no such file; is {Path(run_dir)} a loadgen results directory?") from None
    except OSError as e:
        raise ResultsError(f"{path}: cannot read ({e.strerror})") from None
    try:
        info = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise ResultsError(f"{path}: not valid JSON ({e}); the file is damaged") from None
    if not isinstance(info, dict):
        raise ResultsError(f"{path}: expected a JSON object, got {type(info).__name__}")
    version = info.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise ResultsError(f"{path}: no integer schema_version; not a loadgen results directory")
    if version > SCHEMA_VERSION:
        raise ResultsError(
            f"{path}: schema_version {version} is newer than this loadgen understands ({SCHEMA_VERSION}); upgrade loadgen"
        )
    return info


def read_requests(path: str | Path, *, notes: list[str] | None = None) -> list[RequestRecord]:
    """Every ``RequestRecord`` of ``requests.jsonl``.

    A last line that is not a complete record (a crash mid-write) is dropped and a note appended to
    ``notes``; a bad line anywhere else raises ``ResultsError`` with its line number.
    """
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise ResultsError(f"{p}: no such file") from None
    except OSError as e:
        raise ResultsError(f"{p}: cannot read ({e.strerror})") from None
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    out: list[RequestRecord] = []
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec = _parse_record(line)
        except ValueError as e:
            if i == len(lines):
                if notes is not None:
                    notes.append(
                        f"{p.name}: last line ({len(line)} bytes) is truncated and was ignored; the run was cut short"
                    )
                break
            raise ResultsError(f"{p} line {i}: {e}; the file is corrupt") from None
        out.append(rec)
    return out


def _parse_record(line: bytes) -> RequestRecord:
    try:
        d = orjson.loads(line)
    except orjson.JSONDecodeError:
        raise ValueError("not a JSON record") from None
    if not isinstance(d, dict):
        raise ValueError("not a JSON object")
    missing = [k for k in _REQUIRED_FIELDS if d.get(k) is None]
    if missing:
        raise ValueError(f"record lacks {', '.join(missing)}")
    d.setdefault("session_index", -1)
    d.setdefault("turn_class", TURN_CLASS_FIRST if d["turn_index"] == 0 else TURN_CLASS_FOLLOW_UP)
    for k in ("tenant", "target", "worker"):
        d.setdefault(k, "_")
    try:
        return RequestRecord.from_dict(d)
    except TypeError as e:
        raise ValueError(f"not a request record ({e})") from None


def record_end_us(rec: RequestRecord) -> int:
    """When the request finished: stream closed, else its last known timestamp."""
    for t in (rec.t_end_us, rec.t_last_us, rec.t_first_us):
        if t is not None:
            return t
    return rec.t_send_us


def histograms_from_records(records: Iterable[RequestRecord]) -> dict[str, HdrHistogram]:
    """``{tag: histogram}`` built from records with the runtime's recording rule (exact, clamped).

    The rule is ``records.metric_values``; this spells out the same values in bulk (ITL gaps and
    chunk sizes by the list, not one by one), and a test holds the two equal.
    """
    by_labels: dict[tuple[str, str, str, str], list[int]] = defaultdict(list)
    for r in records:
        labels = (r.turn_class, r.tenant, r.target)
        for metric, value in request_values(r):
            by_labels[(metric, *labels)].append(value)
        if not r.ok:
            continue
        if r.itl_us:
            by_labels[("itl", *labels)].extend(r.itl_us)
        if r.chunks:
            by_labels[("tokens_per_chunk", *labels)].extend(
                r.chunk_tokens if r.chunk_tokens is not None else [1] * r.chunks
            )
    values: dict[str, list[int]] = defaultdict(list)
    for labels, vals in by_labels.items():
        values[histogram_tag(*labels)].extend(vals)  # labels that clean to the same tag share it
    out: dict[str, HdrHistogram] = {}
    for tag, vals in values.items():
        arr = np.clip(np.asarray(vals, dtype=np.int64), HIST_LOWEST_US, HIST_HIGHEST_US)  # as hlog.clamp_us
        hdr.record_many(h := hlog.new_histogram(), arr)
        out[tag] = h
    return out


__all__ = [
    "RunResults",
    "Window",
    "histograms_from_records",
    "load_results",
    "read_requests",
    "read_run_info",
    "record_end_us",
]
