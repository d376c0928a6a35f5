"""loadgen's options inside Locust's own command line (and its web UI start form).

Registered through ``events.init_command_line_parser`` so that the stock
``locust -f <loadgen>/locustfile.py`` accepts them next to every Locust flag. The target URL is
Locust's own ``--host``. ``config_from_options`` turns parsed options into a validated
``RunConfig``; every problem is a one-line ``UserError``.
"""

from __future__ import annotations

import argparse
import math
import os
import secrets
import time
from pathlib import Path
from typing import Any

from analysis.units import parse_duration_s, parse_rate_per_s
from loadgen.adapter_options import parse_adapter_options
from loadgen.config import ARRIVAL_CHOICES, RunConfig
from loadgen.engine.worker_clock import (
    ALLOW_CLOCK_OFFSET_HELP,
    MAX_CLOCK_OFFSET_DEFAULT,
    MAX_CLOCK_OFFSET_HELP,
)
from loadgen.errors import UserError
from loadgen.runtime.loss_timeouts import (
    DEFAULT_MASTER_LOSS_TIMEOUT_S,
    DEFAULT_WORKER_LOSS_TIMEOUT_S,
    MASTER_LOSS_TIMEOUT_HELP,
    WORKER_LOSS_TIMEOUT_HELP,
)
from loadgen.runtime.run_workload import (
    has_timestamps,
    load_workload_named,
    parse_options_flag,
    tokenizer_file_text,
    workload_file_text,
)

DEFAULT_DURATION_S = 60.0


def check_positive(flag: str, value: float, hint: str) -> None:
    """A one-line UserError unless ``value`` is a finite number above 0 (nan and inf included)."""
    if not math.isfinite(value) or value <= 0:
        raise UserError(f"{flag} {value:g}: must be a number above 0 ({hint})")


def check_session_count(num_sessions: int | None, available: int | None, source: str) -> None:
    """``--num-sessions`` may cut a workload or a trace, never ask for more than it holds."""
    if num_sessions and available is not None and num_sessions > available:
        raise UserError(
            f"--num-sessions {num_sessions}: {source} holds only {available} sessions; ask for at most "
            f"{available}, or leave --num-sessions out to replay it whole"
        )


def add_arguments(parser: Any) -> None:
    # parser.add_argument (not a group): only Locust's own add_argument puts an option on the
    # web UI's start form; include_in_web_ui=False keeps internal ones off it.
    g = parser
    g.add_argument("--workload", default="agentic-coding", help="Shipped spec name, a .yaml spec, or a data file (sessions, ShareGPT, Mooncake, Azure)")
    g.add_argument("--workload-format", default="", help="Data file format (sessions, sharegpt, mooncake, azure, burstgpt, bailian, weka-trace); default: detected")
    g.add_argument("--tokenizer", default="", help="Exact token counts: a tokenizer.json, a directory holding one, or a cached ORG/NAME")
    g.add_argument("--workload-options", default="", help="Reader options, e.g. min_turns=2,max_prompt_tokens=4096")
    g.add_argument("--seed", type=int, default=0, help="Seed: same seed, same sessions and arrival times")
    g.add_argument("--arrival", default="auto", choices=ARRIVAL_CHOICES, help="Arrival process (open loop); auto: the workload's timestamps, else poisson")
    g.add_argument("--rate", default="", help="Session arrival rate, e.g. 2 or 120/min (default 1/s); with trace arrivals, rescales the trace to this mean rate")
    g.add_argument("--burstiness", type=float, default=1.0, help="Gamma shape; 1 = Poisson, <1 burstier")
    g.add_argument("--trace", default="", help="Timestamps file for --arrival trace")
    g.add_argument("--trace-time-scale", type=float, default=1.0, help="Multiply trace gaps by this")
    g.add_argument("--concurrency", type=int, default=0, help="Closed loop: N agents back to back (0 = open loop)")
    g.add_argument("--num-sessions", type=int, default=0, help="Exact run: this many sessions (0 = by duration)")
    g.add_argument("--duration", default="", help="Arrivals stop after this long, e.g. 90s (default 60s)")
    g.add_argument("--warmup", default="0s", help="Exclude requests intended before this from summaries")
    g.add_argument("--adapter", default="openai-chat", help="API flavour: openai-chat, openai-completions, llama-server, sglang")
    g.add_argument("--adapter-options", default="", help="Adapter options, e.g. server_history=true (openai-responses)")
    g.add_argument("--model", default="", help="Model name sent in requests")
    g.add_argument("--api-key-env", default="", help="Environment variable holding the API key (never the key itself)")
    g.add_argument("--session-header", default="X-Session-ID", help="Header carrying the session id (router affinity)")
    g.add_argument("--target-label", default="", help="Label for the target in results (default: host:port)")
    g.add_argument("--target-kind", default="openai", help="openai, router, llama-server, sglang, vllm")
    g.add_argument("--cost-per-hour", type=float, default=0.0, help="Target cost in USD/hour, for tokens per dollar")
    g.add_argument("--request-timeout", default="300s", help="Wall-clock deadline per request")
    g.add_argument("--first-byte-timeout", default="0s", help="Deadline from request sent to response headers (0s = off)")
    g.add_argument("--idle-timeout", default="0s", help="Longest silence between chunks of a response (0s = off)")
    g.add_argument("--retry-after-cap", default="0s", help="Wait out a 429's Retry-After up to this, then resend (0s = off)")
    g.add_argument("--ca-cert", default="", help="PEM file of certificates to trust for an https target")
    g.add_argument("--insecure", action="store_true", default=False, help="https without certificate checks (recorded as a warning)")
    g.add_argument("--slo", default="", help="SLOs, e.g. ttft_p99=500ms,itl_p99=50ms (percentile) or ttft=1s (per request)")
    g.add_argument("--max-schedule-lag", default="", help="Schedule-lag p99 above this flags the generator saturated (default: a rule from the arrival gaps and the ITL, at least 10ms)")
    g.add_argument("--results", default="results", help="Results parent directory (master only)")
    g.add_argument("--run-id", default="", help="Results subdirectory name (default: time + workload)")
    g.add_argument("--loadgen-stop-timeout", default="30s", help="How long requests on the wire may finish at stop")
    g.add_argument("--on-worker-loss", default="continue", choices=("continue", "abort"), help="What a lost worker does")
    # Process-wide, not per run: heartbeat timeouts of the master and of each worker (loadgen/runtime/loss_timeouts.py).
    g.add_argument("--worker-loss-timeout", default=f"{DEFAULT_WORKER_LOSS_TIMEOUT_S:g}s", include_in_web_ui=False, help=WORKER_LOSS_TIMEOUT_HELP)
    g.add_argument("--master-loss-timeout", default=f"{DEFAULT_MASTER_LOSS_TIMEOUT_S:g}s", include_in_web_ui=False, help=MASTER_LOSS_TIMEOUT_HELP)
    # Process-wide, not per run: how far a worker's clock may be off the master's (loadgen/engine/worker_clock.py).
    g.add_argument("--max-clock-offset", default=MAX_CLOCK_OFFSET_DEFAULT, include_in_web_ui=False, help=MAX_CLOCK_OFFSET_HELP)
    g.add_argument("--allow-clock-offset", action="store_true", default=False, include_in_web_ui=False, help=ALLOW_CLOCK_OFFSET_HELP)
    g.add_argument("--target-info", default="", include_in_web_ui=False, help=argparse.SUPPRESS)
    # Process-wide, not per run: the endpoint lives as long as the master (docs/prometheus.md).
    g.add_argument("--prometheus-port", type=int, default=0, include_in_web_ui=False, help="Serve /metrics for Prometheus on this port (master only; 0 = off)")
    g.add_argument("--prometheus-host", default="127.0.0.1", include_in_web_ui=False, help="Address of the /metrics endpoint (0.0.0.0 in a pod)")
    g.add_argument("--prometheus-linger", default="0s", include_in_web_ui=False, help="Keep serving the final metrics this long after the run ends")


def _opt(options: Any, name: str, default: Any = None) -> Any:
    return getattr(options, name, default)


def new_run_id(workload: str) -> str:
    stem = Path(workload).stem if ("/" in workload or "." in workload) else workload
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{stem}-{secrets.token_hex(2)}"


def config_from_options(options: Any) -> RunConfig:
    """A validated RunConfig from Locust's parsed options; UserError names the bad flag."""

    def duration(flag: str, value: str) -> float:
        try:
            return parse_duration_s(value)
        except ValueError as e:
            raise UserError(f"--{flag}: {e}") from None

    host = (_opt(options, "host") or "").rstrip("/")
    if not host:
        raise UserError("no target: give --host URL (or use 'loadgen run', which starts a simulated engine)")
    if not host.startswith(("http://", "https://")):
        raise UserError(f"--host {host!r} is not an http(s) URL; use e.g. http://127.0.0.1:8000")
    rate_text = str(_opt(options, "rate", "") or "")
    try:
        rate = parse_rate_per_s(rate_text or "1")
    except ValueError as e:
        raise UserError(f"--rate: {e}") from None
    concurrency = int(_opt(options, "concurrency", 0) or 0)
    num_sessions = int(_opt(options, "num_sessions", 0) or 0)
    if concurrency < 0 or num_sessions < 0:
        raise UserError("--concurrency and --num-sessions must be >= 0")
    dur_text = _opt(options, "duration", "") or ""
    duration_s = duration("duration", dur_text) if dur_text else None
    burstiness = float(_opt(options, "burstiness", 1.0))
    check_positive("--burstiness", burstiness, "1 = Poisson, < 1 burstier")
    trace_time_scale = float(_opt(options, "trace_time_scale", 1.0))
    check_positive("--trace-time-scale", trace_time_scale, "it multiplies the trace's gaps: 0.5 replays twice as fast")
    workload = _opt(options, "workload", "agentic-coding")
    workload_format = _opt(options, "workload_format", "") or None
    workload_options = parse_options_flag(_opt(options, "workload_options", "") or "")
    workload_text = workload_file_text(workload)
    tokenizer = _opt(options, "tokenizer", "") or None
    # A streamed trace is read only as far as --num-sessions asks (loadgen.engine.plan_stream).
    wl = load_workload_named(workload, workload_format, workload_options, tokenizer, stream=True)
    available = wl.sessions_available(at_most=num_sessions or 1)
    check_session_count(num_sessions, available, "the workload")

    tokenizer_json = tokenizer_file_text(tokenizer) if tokenizer else None
    trace = _opt(options, "trace", "") or None
    trace_text = None
    arrival = _opt(options, "arrival", "auto") or "auto"
    if arrival in ("auto", "trace") and not trace:
        has_ts = has_timestamps(workload, workload_format, workload_options, tokenizer)
        if arrival == "trace" and not has_ts:
            raise UserError(
                "--arrival trace needs --trace FILE or a workload with timestamps (a Mooncake or Azure trace, "
                "or a session file with arrival_s)"
            )
        arrival = "trace" if has_ts else "poisson"
    elif arrival == "auto":
        arrival = "trace"  # --trace FILE given: its timestamps are the arrivals
    if arrival == "trace" and trace:
        if not Path(trace).is_file():
            raise UserError(f"--trace {trace}: no such file")
        trace_text = Path(trace).read_text()
    if duration_s is None and not num_sessions and available is None and arrival != "trace":
        # A workload that generates sessions without end runs for the default duration; a trace
        # or a session file (a capture, a dataset) bounds itself and runs whole.
        duration_s = DEFAULT_DURATION_S
    trace_rate = None
    if arrival == "trace" and rate_text:
        if trace_time_scale != 1.0:
            raise UserError("--rate and --trace-time-scale both rescale the trace; give one of them")
        trace_rate = rate
    api_key_env = _opt(options, "api_key_env", "") or None
    if api_key_env and api_key_env not in os.environ:
        raise UserError(f"--api-key-env {api_key_env}: that environment variable is not set")
    ca_cert = _opt(options, "ca_cert", "") or None
    insecure = bool(_opt(options, "insecure", False))
    if ca_cert and insecure:
        raise UserError("--ca-cert and --insecure contradict each other: give one of them")
    if ca_cert and not Path(ca_cert).is_file():
        raise UserError(f"--ca-cert {ca_cert}: no such file")
    slos = [s for s in (_opt(options, "slo", "") or "").split(",") if s.strip()]
    if slos:
        from analysis.slo import parse_slos

        try:
            parse_slos(",".join(slos))
        except ValueError as e:
            raise UserError(f"--slo: {e}") from None
    label = _opt(options, "target_label", "") or host.split("://", 1)[1]
    run_id = _opt(options, "run_id", "") or new_run_id(workload)
    cost = float(_opt(options, "cost_per_hour", 0.0) or 0.0)
    return RunConfig(
        run_id=run_id,
        workload=workload,
        workload_text=workload_text,
        workload_format=workload_format,
        workload_options=workload_options,
        tokenizer=tokenizer,
        tokenizer_json=tokenizer_json,
        seed=int(_opt(options, "seed", 0)),
        arrival=arrival,
        rate_per_s=rate,
        burstiness=burstiness,
        trace_path=trace,
        trace_text=trace_text,
        trace_time_scale=trace_time_scale,
        trace_rate_per_s=trace_rate,
        concurrency=concurrency or None,
        num_sessions=num_sessions or None,
        duration_s=duration_s,
        warmup_s=duration("warmup", _opt(options, "warmup", "0s") or "0s"),
        target_url=host,
        target_label=label,
        adapter=_opt(options, "adapter", "openai-chat"),
        adapter_options=parse_adapter_options(_opt(options, "adapter_options", "") or ""),
        model=_opt(options, "model", "") or None,
        api_key_env=api_key_env,
        session_header=_opt(options, "session_header", "X-Session-ID"),
        target_kind=_opt(options, "target_kind", "openai"),
        cost_per_hour_usd=cost or None,
        request_timeout_s=duration("request-timeout", _opt(options, "request_timeout", "300s")),
        first_byte_timeout_s=duration("first-byte-timeout", _opt(options, "first_byte_timeout", "0s") or "0s") or None,
        idle_timeout_s=duration("idle-timeout", _opt(options, "idle_timeout", "0s") or "0s") or None,
        retry_after_cap_s=duration("retry-after-cap", _opt(options, "retry_after_cap", "0s") or "0s"),
        ca_cert=ca_cert,
        ca_cert_pem=Path(ca_cert).read_text() if ca_cert else None,
        insecure_tls=insecure,
        stop_timeout_s=duration("loadgen-stop-timeout", _opt(options, "loadgen_stop_timeout", "30s")),
        results_dir=_opt(options, "results", "results"),
        slos=slos,
        max_schedule_lag_us=int(duration("max-schedule-lag", _opt(options, "max_schedule_lag", "") or "10ms") * 1e6),
        max_schedule_lag_explicit=bool(_opt(options, "max_schedule_lag", "")),
        on_worker_loss=_opt(options, "on_worker_loss", "continue"),
    )
