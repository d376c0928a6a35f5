"""Session-level numbers: task time and agent overhead per session, and latency by step kind.

Definitions (docs/metrics.md):

* **task time** of a session: from its first request's ``t_send`` to the last token it received
  (the largest ``t_last`` over its requests);
* **model time**: the part of the task time during which at least one of its requests was on the
  wire (the union of their ``[t_send, t_end]`` intervals, so concurrent fan-out children count once);
* **agent overhead**: task time minus model time: thinking, tool latency, and the client's own
  delays between a reply and the next request.

Only *complete* sessions count: every step recorded, all successful, all measured (a session cut by
the end of the run or by an error has no task time). Records written before ``session_steps``
existed cannot tell a cut session from a whole one; there every all-successful session counts.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from hdrh.histogram import HdrHistogram

from analysis.hlog import new_histogram, record_clamped
from analysis.metric_registry import STEP_KIND, metrics_for
from analysis.records import STEP_KINDS, RequestRecord, metric_values

# ttfot: the first answer token (after any reasoning); a record without it records none
STEP_KIND_METRICS = metrics_for(STEP_KIND)


@dataclass(frozen=True, slots=True)
class SessionTimes:
    """One complete session: its id, number of requests, and times in µs."""

    session_id: str
    requests: int
    task_time_us: int
    model_time_us: int

    @property
    def agent_overhead_us(self) -> int:
        return self.task_time_us - self.model_time_us


def step_kind(rec: RequestRecord) -> str:
    """The record's step kind; a record from before DAG sessions has its turn class instead."""
    return rec.step_kind or rec.turn_class


def session_times(records: Iterable[RequestRecord]) -> list[SessionTimes]:
    """The times of every complete session among ``records``, ordered by session id."""
    by_session: dict[str, list[RequestRecord]] = defaultdict(list)
    for rec in records:
        by_session[rec.session_id].append(rec)
    out = []
    for sid in sorted(by_session):
        recs = by_session[sid]
        if not all(r.ok and r.t_last_us is not None and r.t_end_us is not None for r in recs):
            continue
        expected = recs[0].session_steps
        if expected is not None and len(recs) != expected:
            continue
        start = min(r.t_send_us for r in recs)
        end = max(r.t_last_us for r in recs)  # type: ignore[type-var]
        covered = _union_length([(r.t_send_us, min(r.t_end_us, end)) for r in recs])  # type: ignore[type-var]
        out.append(SessionTimes(sid, len(recs), end - start, covered))
    return out


def _union_length(intervals: list[tuple[int, int]]) -> int:
    total = 0
    cur_start = cur_end = None
    for a, b in sorted(intervals):
        if cur_end is None or a > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start  # type: ignore[operator]
            cur_start, cur_end = a, b
        elif b > cur_end:
            cur_end = b
    if cur_end is not None:
        total += cur_end - cur_start  # type: ignore[operator]
    return total


@dataclass(slots=True)
class SessionStats:
    """What ``summary.json: sessions`` is made of: counts and the two histograms (µs)."""

    measured: int  # sessions with at least one measured request
    complete: int  # sessions with a task time (see the module docstring)
    task_time: HdrHistogram
    agent_overhead: HdrHistogram
    agent_overhead_share: float | None  # total overhead / total task time, exact


def session_stats(measured: list[RequestRecord], all_records: list[RequestRecord]) -> SessionStats:
    """Task time and agent overhead of the complete sessions whose every request is measured."""
    measured_ids = {r.request_id for r in measured}
    by_session: dict[str, list[RequestRecord]] = defaultdict(list)
    for rec in all_records:
        by_session[rec.session_id].append(rec)
    in_window = [r for recs in by_session.values() if all(x.request_id in measured_ids for x in recs) for r in recs]
    times = session_times(in_window)
    # clamped: hdrh drops values outside its range, and an overhead of 0 is common
    task = record_clamped(new_histogram(), [t.task_time_us for t in times])
    overhead = record_clamped(new_histogram(), [t.agent_overhead_us for t in times])
    total_task = sum(t.task_time_us for t in times)
    share = round(sum(t.agent_overhead_us for t in times) / total_task, 6) if total_task else None
    return SessionStats(len({r.session_id for r in measured}), len(times), task, overhead, share)


@dataclass(slots=True)
class StepKindStats:
    """One step kind: its measured requests, errors, and ``STEP_KIND_METRICS`` histograms (µs)."""

    requests: int
    errors: int
    histograms: dict[str, HdrHistogram]


def step_kind_stats(measured: list[RequestRecord]) -> dict[str, StepKindStats]:
    """Per step kind (in ``STEP_KINDS`` order), histograms rebuilt from the records with the results
    format's recording rule (``metric_values``): equal to what the runtime recorded for them."""
    groups: dict[str, list[RequestRecord]] = defaultdict(list)
    for rec in measured:
        groups[step_kind(rec)].append(rec)
    order = [k for k in STEP_KINDS if k in groups] + sorted(set(groups) - set(STEP_KINDS))
    out = {}
    for kind in order:
        recs = groups[kind]
        values: dict[str, list[int]] = {m: [] for m in STEP_KIND_METRICS}
        for rec in recs:
            for metric, value in metric_values(rec):
                v = values.get(metric)
                if v is not None:
                    v.append(value)
        hists = {m: record_clamped(new_histogram(), v) for m, v in values.items()}
        ok = sum(1 for r in recs if r.ok)
        out[kind] = StepKindStats(len(recs), len(recs) - ok, hists)
    return out
