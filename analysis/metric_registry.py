"""Every metric, turn class and error category of the results format, declared once.

A metric's entry says what it is (name, title, kind and unit, its formula from a record's fields,
a one-line definition, which is also its Prometheus help text) and which views show it, at which
position: every ordered list of metric names elsewhere (the summary's table, the SLOs, the web UI,
``loadgen ab``, ``compare``, the step-kind table, ``/metrics``) is ``metrics_for(view)``. The
values themselves are computed by ``analysis.records`` (``RequestRecord``'s properties and
``request_values``), the one recording rule the runtime and every rebuild share. docs/metrics.md
holds the same tables for readers, and a test holds the two equal.

Adding a metric: its entry here, its property and line in ``records.request_values`` (or
``metric_values`` for one with many values per request), and its row in docs/metrics.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

# Kinds and units: a duration is recorded in µs (shown in ms), a count in its own unit.
DURATION = "duration"
COUNT = "count"
DURATION_UNIT = "µs"
SUMMARY_DURATION_UNIT = "ms"
TOKENS_UNIT = "tokens"

# The views that name metrics one by one, each in its own order.
SUMMARY_TABLE = "summary_table"  # the summary's metric table (text); the rest follow in METRICS order
SLO = "slo"  # metrics a percentile SLO (metric_pNN=limit) may name
LIVE = "live"  # the web UI's LLM tab and charts
AB = "ab"  # loadgen ab's side-by-side table
COMPARE = "compare"  # loadgen compare's rows, and the gate's keys
STEP_KIND = "step_kind"  # summary.json: by_step_kind
PROMETHEUS = "prometheus"  # the master's /metrics histograms
SWEEP = "sweep"  # loadgen sweep's table (latency per rate) and its plots
VIEWS = (SUMMARY_TABLE, SLO, LIVE, AB, COMPARE, STEP_KIND, PROMETHEUS, SWEEP)

# Turn classes: a session's first turn and the turns after it; ALL_TURNS labels both together.
TURN_CLASS_FIRST = "first"
TURN_CLASS_FOLLOW_UP = "follow-up"
TURN_CLASSES = (TURN_CLASS_FIRST, TURN_CLASS_FOLLOW_UP)
ALL_TURNS = "all"

# Step kinds of a session's DAG (the record's step_kind); a chain's are its turn classes.
STEP_KIND_FAN_OUT_CHILD = "fan-out child"
STEP_KIND_JOIN = "join"
STEP_KINDS = (TURN_CLASS_FIRST, TURN_CLASS_FOLLOW_UP, STEP_KIND_FAN_OUT_CHILD, STEP_KIND_JOIN)


@dataclass(frozen=True, slots=True)
class Metric:
    """One recorded metric. ``views`` maps each view that shows it to its position there."""

    name: str  # record field, JSON key, histogram tag and UI column alike
    title: str  # how prose and plots name it
    kind: str  # DURATION or COUNT
    formula: str  # from a record's fields (docs/metrics.md's notation)
    definition: str  # one line; the Prometheus help text of an exported one
    optional: bool = False  # absent from results written before it existed: no row where none has it
    exported_as: str | None = None  # the Prometheus histogram's name, when /metrics exports it
    views: Mapping[str, int] = field(default_factory=dict, hash=False)

    @property
    def unit(self) -> str:
        """The unit of its recorded values (requests.jsonl, metrics.hlog)."""
        return DURATION_UNIT if self.kind == DURATION else TOKENS_UNIT

    @property
    def summary_unit(self) -> str:
        """The unit of its figures in summary.json."""
        return SUMMARY_DURATION_UNIT if self.kind == DURATION else TOKENS_UNIT


def _at(**positions: int) -> Mapping[str, int]:
    unknown = set(positions) - set(VIEWS)
    if unknown:
        raise ValueError(f"unknown views {sorted(unknown)}")
    return MappingProxyType(positions)


# In the order of the results format (summary.json's metrics, the report's table).
REGISTRY: tuple[Metric, ...] = (
    Metric(
        "ttft", "TTFT", DURATION, "t_first - t_send",
        "Time to first token: first token-bearing chunk minus request sent.",
        exported_as="loadgen_ttft_seconds",
        views=_at(summary_table=0, slo=0, live=0, ab=0, compare=0, step_kind=0, prometheus=0, sweep=0),
    ),
    Metric(
        "ttft_sched", "TTFT from schedule", DURATION, "t_first - t_sched",
        "Time to first token from the intended start (includes client lateness; coordinated-omission free).",
        exported_as="loadgen_ttft_from_schedule_seconds",
        views=_at(summary_table=2, slo=1, compare=4, prometheus=1),
    ),
    Metric(
        "schedule_lag", "schedule lag", DURATION, "t_send - t_sched",
        "Request sent minus its intended start: the generator's own lateness.",
        exported_as="loadgen_schedule_lag_seconds",
        views=_at(summary_table=3, slo=7, live=5, prometheus=7),
    ),
    Metric(
        "itl", "ITL", DURATION, "t_{i+1} - t_i",
        "Inter-token latency: every gap between consecutive token-bearing chunks.",
        exported_as="loadgen_itl_seconds",
        views=_at(summary_table=4, slo=5, live=3, compare=2, step_kind=2, prometheus=3, sweep=2),
    ),
    Metric(
        "tpot", "TPOT", DURATION, "(t_last - t_first) / (N - 1)",
        "Time per output token after the first, per request with 2+ tokens.",
        exported_as="loadgen_tpot_seconds",
        views=_at(summary_table=5, slo=3, live=2, compare=1, step_kind=3, prometheus=4, sweep=1),
    ),
    Metric(
        "e2e", "E2E latency", DURATION, "t_end - t_send",
        "End-to-end latency: stream closed minus request sent.",
        exported_as="loadgen_e2e_seconds",
        views=_at(summary_table=7, slo=6, live=4, compare=3, step_kind=4, prometheus=6, sweep=3),
    ),
    Metric(
        "tokens_per_chunk", "tokens per chunk", COUNT, "chunk_tokens",
        "Tokens carried by each token-bearing chunk (one each where the API does not say).",
    ),
    Metric(
        "ttfot", "TTFOT", DURATION, "t_first_output - t_send",
        "Time to first output token: first non-reasoning token-bearing chunk minus request sent.",
        optional=True,
        exported_as="loadgen_ttfot_seconds",
        views=_at(summary_table=1, slo=2, live=1, ab=1, compare=5, step_kind=1, prometheus=2),
    ),
    Metric(
        "tpot_output", "TPOT of the answer", DURATION, "(t_last - t_first_output) / (N - R - 1)",
        "Time per output token of the answer (reasoning excluded) after its first, per request with 2+.",
        optional=True,
        exported_as="loadgen_tpot_output_seconds",
        views=_at(summary_table=6, slo=4, compare=6, prometheus=5),
    ),
)  # fmt: skip

METRICS_BY_NAME: Mapping[str, Metric] = MappingProxyType({m.name: m for m in REGISTRY})
METRICS: tuple[str, ...] = tuple(m.name for m in REGISTRY)
OPTIONAL_METRICS: tuple[str, ...] = tuple(m.name for m in REGISTRY if m.optional)


def metric(name: str) -> Metric:
    """The registered metric ``name`` (KeyError naming it otherwise)."""
    return METRICS_BY_NAME[name]


def metrics_for(view: str) -> tuple[str, ...]:
    """The names of the metrics ``view`` shows, in its order."""
    if view not in VIEWS:
        raise ValueError(f"unknown view {view!r}; views are {', '.join(VIEWS)}")
    shown = [m for m in REGISTRY if view in m.views]
    return tuple(m.name for m in sorted(shown, key=lambda m: m.views[view]))


# Error categories and who is at fault: the request or the target's address (a redirect, a
# rejected request: fix the client's configuration); the generator's own network (its link down,
# no route, its DNS: the request never left, so it has no send time); a request still on the wire
# when the stop's drain deadline passed (its outcome is unknown: recorded with what arrived,
# neither a success nor a server fault); the server failing or refusing under load (everything
# else, an empty reply included: zero tokens to a request that asked for some).
CLIENT_FAULT = "client"
GENERATOR_FAULT = "generator"
UNKNOWN_OUTCOME = "unknown"
SERVER_FAULT = "server"
FAULTS = (CLIENT_FAULT, GENERATOR_FAULT, UNKNOWN_OUTCOME, SERVER_FAULT)

HTTP_3XX = "http_3xx"
HTTP_4XX = "http_4xx"
HTTP_429 = "http_429"
HTTP_5XX = "http_5xx"
TIMEOUT = "timeout"
CONNECTION = "connection"
STREAM_CUT = "stream_cut"
BAD_CHUNK = "bad_chunk"
EMPTY_REPLY = "empty_reply"
CLIENT_NETWORK = "client_network"
CUT_AT_STOP = "cut_at_stop"


@dataclass(frozen=True, slots=True)
class ErrorCategory:
    """One way a request fails (a record's ``error_category``), and whose fault it is."""

    name: str
    fault: str  # one of FAULTS
    definition: str


# In the order summary.json's errors.by_category lists them.
ERROR_REGISTRY: tuple[ErrorCategory, ...] = (
    ErrorCategory(HTTP_3XX, CLIENT_FAULT, "a redirect: never followed, a load test must not wander to another address"),
    ErrorCategory(HTTP_4XX, CLIENT_FAULT, "a 4xx answer other than 429: the request or the target URL is wrong"),
    ErrorCategory(HTTP_429, SERVER_FAULT, "too many requests, not waited out (no Retry-After, or over the cap)"),
    ErrorCategory(HTTP_5XX, SERVER_FAULT, "a 5xx answer, or an error object inside a 2xx stream"),
    ErrorCategory(TIMEOUT, SERVER_FAULT, "a deadline passed: the request's, the first byte's or a stream's silence"),
    ErrorCategory(CONNECTION, SERVER_FAULT, "nothing usable came back: refused, reset, closed before the headers"),
    ErrorCategory(STREAM_CUT, SERVER_FAULT, "the stream ended or broke before its end marker"),
    ErrorCategory(BAD_CHUNK, SERVER_FAULT, "a line the adapter cannot parse, too long, or in an unsupported encoding"),
    ErrorCategory(EMPTY_REPLY, SERVER_FAULT, "a successful reply without a token-bearing chunk to a request that asked for tokens"),
    ErrorCategory(CLIENT_NETWORK, GENERATOR_FAULT, "the generator's own network failed: the request never left"),
    ErrorCategory(CUT_AT_STOP, UNKNOWN_OUTCOME, "still on the wire when the stop's drain deadline passed"),
)  # fmt: skip

ERROR_CATEGORIES: tuple[str, ...] = tuple(c.name for c in ERROR_REGISTRY)


def error_categories_of(fault: str) -> tuple[str, ...]:
    """The error categories at ``fault`` (one of FAULTS), in ERROR_CATEGORIES order."""
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; faults are {', '.join(FAULTS)}")
    return tuple(c.name for c in ERROR_REGISTRY if c.fault == fault)


CLIENT_ERROR_CATEGORIES = error_categories_of(CLIENT_FAULT)
GENERATOR_ERROR_CATEGORIES = error_categories_of(GENERATOR_FAULT)
SERVER_FAULT_CATEGORIES = error_categories_of(SERVER_FAULT)


__all__ = [
    "AB",
    "ALL_TURNS",
    "BAD_CHUNK",
    "CLIENT_ERROR_CATEGORIES",
    "CLIENT_FAULT",
    "CLIENT_NETWORK",
    "COMPARE",
    "CONNECTION",
    "COUNT",
    "CUT_AT_STOP",
    "DURATION",
    "DURATION_UNIT",
    "EMPTY_REPLY",
    "ERROR_CATEGORIES",
    "ERROR_REGISTRY",
    "FAULTS",
    "GENERATOR_ERROR_CATEGORIES",
    "GENERATOR_FAULT",
    "HTTP_3XX",
    "HTTP_4XX",
    "HTTP_5XX",
    "HTTP_429",
    "LIVE",
    "METRICS",
    "METRICS_BY_NAME",
    "OPTIONAL_METRICS",
    "PROMETHEUS",
    "REGISTRY",
    "SERVER_FAULT",
    "SERVER_FAULT_CATEGORIES",
    "SLO",
    "STEP_KIND",
    "STEP_KINDS",
    "STEP_KIND_FAN_OUT_CHILD",
    "STEP_KIND_JOIN",
    "STREAM_CUT",
    "SUMMARY_DURATION_UNIT",
    "SUMMARY_TABLE",
    "SWEEP",
    "TIMEOUT",
    "TOKENS_UNIT",
    "TURN_CLASSES",
    "TURN_CLASS_FIRST",
    "TURN_CLASS_FOLLOW_UP",
    "UNKNOWN_OUTCOME",
    "VIEWS",
    "ErrorCategory",
    "Metric",
    "error_categories_of",
    "metric",
    "metrics_for",
]
