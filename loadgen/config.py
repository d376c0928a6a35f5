"""The run configuration: everything a worker needs to replay its share of a run.

``RunConfig`` travels from the master to every worker inside the plan (docs/distributed.md), so a worker on
another machine needs no flags but the master's address. It never holds secrets: the API key is
named by ``api_key_env`` and read from the worker's own environment.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

ARRIVAL_KINDS = ("poisson", "gamma", "constant", "trace")
# "auto": the workload's own timestamps when it has them (traces), else Poisson.
ARRIVAL_CHOICES = ("auto", *ARRIVAL_KINDS)
# --connections: what a session's connection does when the session ends (loadgen.engine.connection_pool).
CONNECTION_MODES = ("pooled", "per-session")


@dataclass
class RunConfig:
    run_id: str
    workload: str  # shipped spec name or path
    workload_format: str | None = None  # reader name (workloads.readers); None: detected
    workload_options: dict[str, str] = field(default_factory=dict)  # reader options
    tokenizer: str | None = None  # --tokenizer: a tokenizer.json, a directory or a cached ORG/NAME
    seed: int = 0
    # Arrivals: open loop (rate/burstiness/trace) unless concurrency is set (closed loop).
    arrival: str = "poisson"
    rate_per_s: float | None = None
    burstiness: float = 1.0
    trace_path: str | None = None
    trace_time_scale: float = 1.0
    # With trace arrivals: rescale the gaps so the mean rate is this (the trace's shape is kept).
    trace_rate_per_s: float | None = None
    concurrency: int | None = None
    num_sessions: int | None = None
    duration_s: float | None = None
    warmup_s: float = 0.0
    # Target
    target_url: str = ""
    target_label: str = "default"
    adapter: str = "openai-chat"
    adapter_options: dict[str, Any] = field(default_factory=dict)
    model: str | None = None
    api_key_env: str | None = None
    session_header: str = "X-Session-ID"
    extra_headers: dict[str, str] = field(default_factory=dict)
    request_timeout_s: float = 300.0
    connect_timeout_s: float = 10.0
    first_byte_timeout_s: float | None = None  # request sent -> response headers; None: off
    idle_timeout_s: float | None = None  # longest silence inside a response body; None: off
    retry_after_cap_s: float = 0.0  # wait out a 429's Retry-After up to this, then retry; 0: off
    # What a session's connection does when the session ends: pooled (the next session takes it)
    # or per-session (closed): loadgen.engine.connection_pool.
    connections: str = "pooled"
    ca_cert: str | None = None  # PEM file trusted for https targets (content in ca_cert_pem)
    insecure_tls: bool = False  # https without certificate checks (recorded as a warning)
    target_kind: str = "openai"
    target_labels: dict[str, str] = field(default_factory=dict)
    cost_per_hour_usd: float | None = None
    # Run control
    stop_timeout_s: float = 30.0
    report_interval_s: float = 1.0
    results_dir: str = "results"
    slos: list[str] = field(default_factory=list)
    max_schedule_lag_us: int = 10_000
    # Whether --max-schedule-lag was given; else the summary's rule sets the bounds (the value
    # above is their floor): analysis/generator_health.py, docs/performance.md.
    max_schedule_lag_explicit: bool = False
    on_worker_loss: str = "continue"
    # Workload file content for workers that do not share the master's filesystem.
    workload_text: str | None = None
    # A streamed trace's size in bytes, when a worker without the file may pull it from the
    # master in chunks (loadgen.runtime.file_ship); None: nothing to pull.
    workload_pull_bytes: int | None = None
    trace_text: str | None = None
    tokenizer_json: str | None = None
    ca_cert_pem: str | None = None

    @property
    def mode(self) -> str:
        return "closed-loop" if self.concurrency else "open-loop"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunConfig:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def public_dict(self) -> dict[str, Any]:
        """For run.json: no file contents (they can be large), never a secret (there is none here)."""
        d = self.to_dict()
        d.pop("workload_text", None)
        d.pop("trace_text", None)
        d.pop("tokenizer_json", None)
        d.pop("ca_cert_pem", None)
        d["mode"] = self.mode
        return d


@dataclass
class Plan:
    """A worker's part of the run: slot ``slot`` of ``n_workers``; arrivals anchored at ``t0_unix_s``."""

    config: RunConfig
    n_workers: int
    slot: int
    t0_unix_s: float

    def to_wire(self) -> dict[str, Any]:
        return {"config": self.config.to_dict(), "n": self.n_workers, "slot": self.slot, "t0": self.t0_unix_s}

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> Plan:
        return cls(RunConfig.from_dict(d["config"]), int(d["n"]), int(d["slot"]), float(d["t0"]))
