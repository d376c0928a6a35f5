"""The results format: file names, the per-request record, and the histogram tag scheme.

This is the contract between the runtime (``loadgen``, which writes) and ``analysis`` (which
reads). ``analysis`` imports nothing else of ours; ``loadgen.runtime.results_writer`` writes exactly these
fields. The user-facing description is ``docs/results-format.md``; change both together and bump
``SCHEMA_VERSION`` on an incompatible change.

Times in a record are integer microseconds since the run's start (``run.json: t0_unix_s``), taken
from each worker's monotonic clock (``time.perf_counter_ns``) and anchored to the run start in the
worker's plan. Metric definitions are in docs/metrics.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from itertools import repeat
from typing import Any

# Re-exported: the results format's names, declared in the registry.
from analysis.metric_registry import (  # noqa: F401
    CLIENT_ERROR_CATEGORIES,
    CUT_AT_STOP,
    ERROR_CATEGORIES,
    GENERATOR_ERROR_CATEGORIES,
    METRICS,
    SERVER_FAULT_CATEGORIES,
    STEP_KINDS,
)

SCHEMA_VERSION = 1

RUN_FILE = "run.json"
REQUESTS_FILE = "requests.jsonl"
METRICS_FILE = "metrics.hlog"
SUMMARY_FILE = "summary.json"
REPORT_FILE = "report.html"

# HDR histograms: values in µs, 1 µs .. 1 h, 3 significant digits (docs/metrics.md).
HIST_LOWEST_US = 1
HIST_HIGHEST_US = 3_600_000_000
HIST_SIGNIFICANT_DIGITS = 3

# Metric names, error categories with their faults, turn classes and step kinds are declared in
# analysis.metric_registry (re-exported here: this module is the results format's contract).
# tokens_per_chunk is a count, not a duration; it shares the histogram machinery.

STATUS_OK = "ok"
STATUS_ERROR = "error"

# run.json "status"
RUN_RUNNING = "running"
RUN_COMPLETE = "complete"
RUN_ABORTED = "aborted"


@dataclass(slots=True)
class RequestRecord:
    """One request, one line of ``requests.jsonl``. Field names are the JSON keys."""

    request_id: str
    session_id: str
    session_index: int
    turn_index: int
    turn_class: str  # "first" | "follow-up"
    tenant: str
    target: str  # target label
    worker: str  # worker id that sent it
    status: str  # "ok" | "error"
    t_sched_us: int  # intended start
    t_send_us: int  # request written
    t_first_us: int | None = None  # first token-bearing chunk
    t_last_us: int | None = None  # last token-bearing chunk
    t_end_us: int | None = None  # stream closed
    output_tokens: int = 0  # N: usage.completion_tokens when reported, else token-bearing chunks
    chunks: int = 0  # token-bearing chunks received
    usage_completion_tokens: int | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    max_tokens: int | None = None
    itl_us: list[int] = field(default_factory=list)  # gaps between consecutive token-bearing chunks
    chunk_tokens: list[int] | None = None  # tokens per chunk, None when every chunk carried one
    error_category: str | None = None
    error_message: str | None = None
    http_status: int | None = None
    server_timings: dict[str, Any] | None = None  # engine-reported per-request timings
    throttled: int = 0  # 429 answers waited out (Retry-After) and retried before this outcome
    # The session's DAG (absent in files written before it existed: read as None). step_kind is
    # "first" | "follow-up" | "fan-out child" | "join"; depth is 0 at the first step; session_steps
    # is how many steps the session has, so a reader can tell a finished session from a cut one.
    step_id: str | None = None
    step_kind: str | None = None
    parent_ids: list[str] | None = None
    depth: int | None = None
    session_steps: int | None = None
    # Prompt tokens as the run's tokenizer counts the messages' contents (no chat template): set
    # against the server's prompt_tokens, a check that prompts are as large as intended.
    client_prompt_tokens: int | None = None
    # Tokens the token-bearing chunks carried (the sum of chunk_tokens; chunks when that is null):
    # set beside usage_completion_tokens so a reader sees where the two disagree; output_tokens
    # is chosen from them by the rule of docs/metrics.md. Null in older files.
    chunk_output_tokens: int | None = None
    # False when nothing of the request left the generator (its connect failed): it has no send
    # time, t_send_us then equals t_sched_us, and it must add no schedule-lag value. True in
    # older files.
    sent: bool = True
    # Reasoning (null in older files). t_first_output_us: the first token-bearing chunk that is
    # not reasoning (content or tool-call arguments); equal to t_first_us when the reply had no
    # reasoning, null when it had only reasoning. reasoning_tokens: the server's usage count of
    # reasoning tokens (completion_tokens_details / output_tokens_details) when it reports one at
    # least the reasoning chunks' tokens, else the tokens the reasoning chunks carried; part of
    # output_tokens.
    t_first_output_us: int | None = None
    reasoning_tokens: int | None = None
    # Of client_prompt_tokens, the history's tokens the server held and the request did not send
    # (server-side history: openai-responses server_history); null when it sent everything.
    server_held_prompt_tokens: int | None = None

    # Derived values: the formulas of docs/metrics.md, in one place.
    @property
    def ok(self) -> bool:
        return self.status == STATUS_OK

    @property
    def ttft_us(self) -> int | None:
        return None if self.t_first_us is None else self.t_first_us - self.t_send_us

    @property
    def ttft_sched_us(self) -> int | None:
        return None if self.t_first_us is None else self.t_first_us - self.t_sched_us

    @property
    def schedule_lag_us(self) -> int:
        return self.t_send_us - self.t_sched_us

    @property
    def e2e_us(self) -> int | None:
        return None if self.t_end_us is None else self.t_end_us - self.t_send_us

    @property
    def tpot_us(self) -> float | None:
        if self.t_first_us is None or self.t_last_us is None or self.output_tokens < 2:
            return None
        return (self.t_last_us - self.t_first_us) / (self.output_tokens - 1)

    @property
    def ttfot_us(self) -> int | None:
        """Time to first output token: the first non-reasoning token after ``t_send``."""
        return None if self.t_first_output_us is None else self.t_first_output_us - self.t_send_us

    @property
    def output_only_tokens(self) -> int:
        """``output_tokens`` less the reasoning tokens: the answer's tokens."""
        return self.output_tokens - (self.reasoning_tokens or 0)

    @property
    def tpot_output_us(self) -> float | None:
        """TPOT over the answer only: ``(t_last - t_first_output) / (N - reasoning - 1)``, for
        answers of at least 2 tokens. Equals ``tpot_us`` when the reply had no reasoning."""
        n = self.output_only_tokens
        if self.t_first_output_us is None or self.t_last_us is None or n < 2:
            return None
        return (self.t_last_us - self.t_first_output_us) / (n - 1)

    def to_dict(self) -> dict[str, Any]:
        # Not dataclasses.asdict: it deep-copies recursively and is ~10x slower on the hot path.
        return {name: getattr(self, name) for name in _FIELD_ORDER}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RequestRecord:
        known = _FIELD_NAMES
        return cls(**{k: v for k, v in d.items() if k in known})


_FIELD_ORDER = tuple(f.name for f in fields(RequestRecord))
_FIELD_NAMES = frozenset(_FIELD_ORDER)
# A record's fields in the order of its constructor's arguments (the wire's rows: loadgen.engine.record_rows).
RECORD_FIELDS: tuple[str, ...] = _FIELD_ORDER


def histogram_tag(metric: str, turn_class: str, tenant: str, target: str) -> str:
    """The ``Tag=`` of an interval line in ``metrics.hlog``: ``metric:turn_class:tenant:target``.

    HdrHistogram log tags may not contain commas or whitespace; labels are sanitised.
    """
    return ":".join(_clean(x) for x in (metric, turn_class, tenant, target))


def parse_histogram_tag(tag: str) -> tuple[str, str, str, str]:
    parts = tag.split(":")
    if len(parts) != 4:
        raise ValueError(f"histogram tag {tag!r} is not metric:turn_class:tenant:target")
    return parts[0], parts[1], parts[2], parts[3]


def tag_label(label: str) -> str:
    """``label`` as it appears inside a histogram tag (commas, colons and whitespace become ``_``)."""
    return _clean(label)


def request_values(rec: RequestRecord) -> list[tuple[str, int]]:
    """The (metric, value) pairs of the metrics one request has one value of (every metric but
    ``itl`` and ``tokens_per_chunk``), in µs, by the recording rule of ``metric_values``.

    The one spelling of the per-request formulas (``RequestRecord``'s properties) under that rule:
    ``metric_values``, the live sums (``loadgen.engine.recorder.metric_sums``) and the bulk rebuild
    (``analysis.results.histograms_from_records``) all take these values from here.
    """
    # A request that never left (client_network) has no send time, so no lag.
    out = [("schedule_lag", rec.schedule_lag_us)] if rec.sent else []
    if rec.status != STATUS_OK:
        return out
    ttft = rec.ttft_us
    if ttft is not None:
        out.append(("ttft", ttft))
        out.append(("ttft_sched", rec.ttft_sched_us))  # type: ignore[arg-type]
    e2e = rec.e2e_us
    if e2e is not None:
        out.append(("e2e", e2e))
    tpot = rec.tpot_us
    if tpot is not None:
        out.append(("tpot", round(tpot)))
    ttfot = rec.ttfot_us
    if ttfot is not None:
        out.append(("ttfot", ttfot))
        tpot_output = rec.tpot_output_us
        if tpot_output is not None:
            out.append(("tpot_output", round(tpot_output)))
    return out


def metric_values(rec: RequestRecord) -> list[tuple[str, int]]:
    """The (metric, value) pairs one request contributes to the histograms, in µs (counts for
    ``tokens_per_chunk``); values are not yet clamped to the histogram range.

    The recording rule of the results format: ``schedule_lag`` from every request that was sent
    (it measures the generator, not the server); every other metric from successful requests only.
    The runtime records exactly these values, and ``analysis`` rebuilds histograms from
    ``requests.jsonl`` with the same function, so the two agree bit for bit. A list, built with
    ``zip`` rather than yielded pair by pair: a request's gaps are hundreds of values, and this
    runs once per request on the worker.
    """
    out = request_values(rec)
    for metric, values in series_values(rec):
        out.extend(zip(repeat(metric), values))
    return out


def series_values(rec: RequestRecord) -> list[tuple[str, Sequence[int]]]:
    """The metrics one request has many values of, each with its values: ``itl`` (its gaps) and
    ``tokens_per_chunk``, by the recording rule of ``metric_values`` (which is ``request_values``
    and these, pair by pair). For a recorder that takes a metric's values at once."""
    if rec.status != STATUS_OK:
        return []
    out: list[tuple[str, Sequence[int]]] = [("itl", rec.itl_us)]
    if rec.chunks:
        out.append(("tokens_per_chunk", [1] * rec.chunks if rec.chunk_tokens is None else rec.chunk_tokens))
    return out


def _clean(label: str) -> str:
    return "".join("_" if (c in ",: \t\n") else c for c in str(label)) or "_"
