"""Every option of a run, declared once: ``RUN_OPTIONS``.

One row says an option's flag, kind, default (as a user would type it), unit, help, validation and
which processes take it: the ``loadgen`` commands (the front), Locust's parser in the master and
local processes (and so the web UI's start form), and the plan every worker gets (the
``RunConfig`` field, which ``run.json`` records). From the table come:

- the click options of ``run``, ``master``, ``ab``, ``sweep`` and ``worker`` (``loadgen.cli``);
- Locust's arguments and its web form (``loadgen.runtime.locust_options.add_arguments``);
- the flags the front passes to Locust (``locust_args``) and the front's ``RunOptions``;
- the plan's fields (``loadgen.runtime.locust_options.config_from_options``).

A value is checked by ``RunOption.parse``, one function with one message per mistake, wherever it
is read: the front checks every option before anything starts, and the Locust process checks the
same text again with the same function because the stock ``locust -f loadgen/locustfile.py`` starts
there. Checks that join several options are in ``resolve_arrival`` and ``check_session_count``.

Adding an option: one row here (and, when workers need it, a ``RunConfig`` field of the same
meaning); ``tests/unit/test_run_options.py`` fails on a row the derivations disagree with.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable
from dataclasses import Field, dataclass, field, make_dataclass
from pathlib import Path
from typing import Any

from analysis.units import parse_duration_s, parse_rate_per_s
from loadgen.config import ARRIVAL_CHOICES, CONNECTION_MODES
from loadgen.engine.worker_clock import (
    ALLOW_CLOCK_OFFSET_HELP,
    MAX_CLOCK_OFFSET_DEFAULT,
    MAX_CLOCK_OFFSET_HELP,
    parse_max_clock_offset,
)
from loadgen.errors import UserError
from loadgen.runtime.loss_timeouts import (
    DEFAULT_MASTER_LOSS_TIMEOUT_S,
    DEFAULT_WORKER_LOSS_TIMEOUT_S,
    MASTER_LOSS_TIMEOUT_HELP,
    WORKER_LOSS_TIMEOUT_HELP,
    parse_loss_timeout,
)

# Kinds of value. The front keeps a duration's or a rate's text as the user wrote it (it is passed
# on to Locust as written); numbers are numbers on both sides.
TEXT = "text"  # free text; empty: not given
INT = "int"
FLOAT = "float"
DURATION = "duration"  # e.g. 300s, 1.5m, 500ms: seconds
RATE = "rate"  # e.g. 2, 2/s, 120/min: per second
CHOICE = "choice"
FLAG = "flag"  # on or off
FILE = "file"  # an existing file
DIRECTORY = "directory"  # a directory to create or use
SLOS = "slos"  # ttft_p99=500ms,...: analysis/slo.py
KEY_VALUES = "key=value"  # a=1,b=x: reader or adapter options

# The commands whose flags a row may be: the front's processes.
RUN, MASTER, AB, SWEEP, WORKER = "run", "master", "ab", "sweep", "worker"
LOAD_COMMANDS = frozenset({RUN, MASTER, AB, SWEEP})  # every command that runs a workload

# The front's own state that is no flag (set by a target file, a command's caller or a test).
_FRONT_STATE: tuple[tuple[str, Any], ...] = (
    ("master", False),
    ("web_host", "127.0.0.1"),  # the web UI of 'loadgen run --web' stays on loopback
    ("target_labels", field(default_factory=dict)),
    ("expect", field(default_factory=dict)),
    ("quiet", False),
    ("extra_locust_args", field(default_factory=list)),
)
DEFAULT_DURATION_S = 60.0


@dataclass(frozen=True)
class RunOption:
    """One option of a run (see the module's docstring for what is derived from it)."""

    flag: str
    kind: str
    default: Any  # as a user would type it; None: not given
    help: str
    unit: str = ""  # of the parsed value: s, 1/s, USD/h, ...
    commands: frozenset[str] = LOAD_COMMANDS  # the loadgen commands that take it
    locust_flag: str | None = ""  # "": the same flag in Locust's parser; None: not there
    web_form: bool = True  # on Locust's web UI start form (when Locust takes it)
    field: str | None = None  # the RunConfig field it fills: the plan's and run.json's
    choices: tuple[str, ...] = ()
    minimum: float | None = None  # lowest value allowed (INT, FLOAT)
    above_zero: str = ""  # FLOAT: must be > 0; the hint said when it is not
    check: Callable[[str, Any], Any] | None = None  # extra check of the parsed value (flag, value)
    required: bool = False
    metavar: str | None = None
    hidden: bool = False  # left out of --help (internal plumbing)

    @property
    def attr(self) -> str:
        """The Python name of the value (the front's ``RunOptions`` field)."""
        return self.flag.removeprefix("--").replace("-", "_")

    @property
    def locust(self) -> str | None:
        """The flag in Locust's parser, or None when the Locust processes do not take it."""
        return None if self.locust_flag is None else (self.locust_flag or self.flag)

    @property
    def locust_dest(self) -> str | None:
        return None if self.locust is None else self.locust.removeprefix("--").replace("-", "_")

    @property
    def processes(self) -> tuple[str, ...]:
        """Who needs it: the front (a loadgen command), the Locust master, the workers (the plan)."""
        return tuple(
            name for name, yes in (("front", bool(self.commands)), ("master", self.locust is not None), ("workers", bool(self.field))) if yes
        )

    def parse(self, raw: Any) -> Any:
        """The value in ``raw`` (text or already a value), checked; a one-line UserError naming the flag."""
        value = self._parse(raw)
        if self.check is not None and value is not None:
            self.check(self.flag, value)
        return value

    def _parse(self, raw: Any) -> Any:
        flag, kind = self.flag, self.kind
        if kind == FLAG:
            if isinstance(raw, str):
                return raw.strip().lower() in ("1", "true", "yes", "on")
            return bool(raw)
        text = "" if raw is None else str(raw).strip()
        if not text and self.default is not None:
            text = str(self.default)  # left empty (a cleared web form field): the default
        if kind in (INT, FLOAT):
            if not text:
                return None
            try:
                value: Any = int(text) if kind == INT else float(text)
            except ValueError:
                what = "a whole number" if kind == INT else "a number"
                raise UserError(f"{flag} {text!r}: not {what}") from None
            if self.above_zero and (not math.isfinite(value) or value <= 0):
                raise UserError(f"{flag} {value:g}: must be a number above 0 ({self.above_zero})")
            if self.minimum is not None and not value >= self.minimum:
                raise UserError(f"{flag} {value:g}: must be {self.minimum:g} or more")
            return value
        if not text:
            return None
        if kind == DURATION:
            try:
                return parse_duration_s(text)
            except ValueError as e:
                raise UserError(f"{flag}: {e}") from None
        if kind == RATE:
            try:
                return parse_rate_per_s(text)
            except ValueError as e:
                raise UserError(f"{flag}: {e}") from None
        if kind == CHOICE:
            if text not in self.choices:
                raise UserError(f"{flag} {text!r}: choose one of {', '.join(self.choices)}")
            return text
        if kind == FILE:
            if not Path(text).is_file():
                raise UserError(f"{flag} {text}: no such file")
            return text
        if kind == DIRECTORY:
            if Path(text).exists() and not Path(text).is_dir():
                raise UserError(f"{flag} {text}: is a file, not a directory")
            return text
        if kind == SLOS:
            from analysis.slo import parse_slos

            try:
                parse_slos(text)
            except ValueError as e:
                raise UserError(f"{flag}: {e}") from None
            return [s for s in text.split(",") if s.strip()]
        if kind == KEY_VALUES:
            return _key_values(flag, text)
        return text

    def front_value(self, raw: Any) -> Any:
        """What the front keeps after checking ``raw``: a duration's, a rate's, an SLO's or a key=value
        list's text as written (it goes on to Locust as written), numbers as numbers."""
        value = self.parse(raw)
        if self.kind in (INT, FLOAT, FLAG) or value is None:
            return value
        return str(raw).strip()


def _key_values(flag: str, text: str) -> dict[str, Any]:
    if flag == "--adapter-options":
        from loadgen.adapter_options import parse_adapter_options

        return parse_adapter_options(text)
    from loadgen.runtime.run_workload import parse_options_flag

    return parse_options_flag(text)


def _env_var_is_set(flag: str, name: str) -> None:
    if name not in os.environ:
        raise UserError(f"{flag} {name}: that environment variable is not set")


def _loss_timeout(flag: str, seconds: float) -> None:
    parse_loss_timeout(flag, f"{seconds:g}s")


def _clock_offset(flag: str, seconds: float) -> None:
    try:
        parse_max_clock_offset(f"{seconds:g}s")
    except ValueError as e:
        raise UserError(f"{flag}: {e}") from None


def _port(flag: str, port: int) -> None:
    if not 0 <= port <= 65535:
        raise UserError(f"{flag} {port}: a port is 0 to 65535")


def _power_metrics(flag: str, text: str) -> None:
    if text.strip() == "embedded":  # every replica of the embedded fleet (loadgen/commands/power_scrape.py)
        return
    from targets.power import parse_power_metrics

    try:
        parse_power_metrics(flag, text)
    except ValueError as e:
        raise UserError(str(e)) from None


def _opt(flag: str, kind: str, default: Any, help: str, **kw: Any) -> RunOption:
    return RunOption(flag, kind, default, help, **kw)


_FRONT = {"locust_flag": None}  # the front's own: fleet, processes, report (Locust never sees them)

RUN_OPTIONS: tuple[RunOption, ...] = (
    # The workload
    _opt("--workload", TEXT, "agentic-coding", "Shipped spec name, .yaml spec, or data file (session .jsonl, ShareGPT .json, Mooncake .jsonl, Azure .csv).", field="workload"),
    _opt("--workload-format", TEXT, None, "Data file format: sessions, sharegpt, mooncake, azure, burstgpt, bailian, weka-trace (default: detected).", field="workload_format"),
    _opt("--workload-options", KEY_VALUES, None, "Reader options, e.g. min_turns=2,max_prompt_tokens=4096 or block_size=512.", field="workload_options"),
    _opt("--tokenizer", TEXT, None, "Exact prompt lengths and output counts: a tokenizer.json, a directory holding one, or a cached ORG/NAME.", field="tokenizer"),
    _opt("--seed", INT, 0, "Same seed: same sessions, prompts, arrival times.", field="seed"),
    # Arrivals
    _opt("--arrival", CHOICE, "auto", "auto: the workload's own timestamps (traces), else poisson.", choices=ARRIVAL_CHOICES, field="arrival"),
    _opt("--rate", RATE, None, "Session arrivals per second, e.g. 2 or 30/min (default 1); with trace arrivals, the trace is rescaled to this mean rate.", unit="1/s", field="rate_per_s"),
    _opt("--burstiness", FLOAT, 1.0, "Gamma shape (1 = Poisson; < 1 burstier).", above_zero="1 = Poisson, < 1 burstier", field="burstiness"),
    _opt("--trace", FILE, None, "Timestamps file for --arrival trace.", field="trace_path"),
    _opt("--trace-time-scale", FLOAT, 1.0, "Multiply the trace's gaps by this (0.5 replays twice as fast).", above_zero="it multiplies the trace's gaps: 0.5 replays twice as fast", field="trace_time_scale"),
    _opt("--concurrency", INT, 0, "Closed loop: N agents back to back (0 = open loop).", minimum=0, field="concurrency"),
    _opt("--num-sessions", INT, 0, "Exact run of N sessions (0 = by duration).", minimum=0, field="num_sessions"),
    _opt("--duration", DURATION, None, "Arrivals stop after this long (default 60s unless --num-sessions or a bounded workload).", unit="s", field="duration_s"),
    _opt("--warmup", DURATION, "0s", "Exclude requests intended before this from summaries.", unit="s", field="warmup_s"),
    # The target
    _opt("--target", TEXT, None, "Base URL of the server (default: an embedded simulated engine).", **_FRONT),
    _opt("--target-file", FILE, None, "YAML: url, adapter, model, cost_per_hour, labels, expect.", **_FRONT),
    _opt("--adapter", TEXT, "openai-chat", "API flavour (loadgen.targets entry points): openai-chat, openai-completions, llama-server, sglang, ...", field="adapter"),
    _opt("--adapter-options", KEY_VALUES, None, "The adapter's options, e.g. server_history=true (openai-responses); docs/targets.md.", field="adapter_options"),
    _opt("--model", TEXT, None, "Model name to send.", field="model"),
    _opt("--expect-model", TEXT, None, "Abort before load unless the server serves this model.", **_FRONT),
    _opt("--api-key-env", TEXT, None, "Environment variable that holds the API key (never the key itself).", check=_env_var_is_set, field="api_key_env"),
    _opt("--session-header", TEXT, None, "Header for the session id (default X-Session-ID or the router's).", field="session_header"),
    _opt("--target-label", TEXT, None, "The target's name in results (default: host:port).", field="target_label"),
    _opt("--target-kind", TEXT, None, "openai, router, llama-server, sglang, vllm (default: openai).", commands=frozenset(), field="target_kind"),
    _opt("--power-metrics", TEXT, None, "GPU exporter /metrics (dcgm-exporter, AMD device-metrics-exporter) scraped each second for energy per token: URL for the fleet or TARGET=URL, comma-separated; 'embedded' for the embedded sims.", metavar="URL|TARGET=URL,...", check=_power_metrics, **_FRONT),
    _opt("--cost-per-hour", FLOAT, None, "Target cost in USD/hour (tokens per dollar).", unit="USD/h", minimum=0, field="cost_per_hour_usd"),
    _opt("--request-timeout", DURATION, "300s", "Wall-clock deadline per request.", unit="s", field="request_timeout_s"),
    _opt("--first-byte-timeout", DURATION, "0s", "Deadline from request sent to response headers (0s = off).", unit="s", field="first_byte_timeout_s"),
    _opt("--idle-timeout", DURATION, "0s", "Longest silence between chunks of a response (0s = off).", unit="s", field="idle_timeout_s"),
    _opt("--connections", CHOICE, "pooled", "pooled: a finished session's kept-alive connection carries the next session; per-session: each session connects and closes its own.", choices=CONNECTION_MODES, field="connections"),
    _opt("--retry-after-cap", DURATION, "0s", "Wait out a 429's Retry-After up to this, then resend (0s = off: a 429 fails).", unit="s", field="retry_after_cap_s"),
    _opt("--ca-cert", FILE, None, "PEM certificates to trust for an https:// target.", field="ca_cert"),
    _opt("--insecure", FLAG, False, "https:// without certificate checks (recorded in run.json as a warning).", field="insecure_tls"),
    # Run control and results
    _opt("--stop-timeout", DURATION, "30s", "How long requests on the wire may finish at stop.", unit="s", locust_flag="--loadgen-stop-timeout", field="stop_timeout_s"),
    _opt("--slo", SLOS, None, "e.g. ttft_p99=500ms,itl_p99=50ms; per request: ttft=1s,tpot=80ms.", field="slos"),
    _opt("--max-schedule-lag", DURATION, None, "Bound on the generator's lag p99 (default: a rule from the arrival gaps and the ITL, at least 10ms; docs/performance.md).", unit="s", field="max_schedule_lag_us"),
    _opt("--results", DIRECTORY, "results", "Results parent directory.", field="results_dir"),
    _opt("--run-id", TEXT, None, "Results subdirectory name (default: time + workload).", field="run_id"),
    # The embedded fleet (front only)
    _opt("--profile", TEXT, "h200-llama3-8b-fp8", "Embedded sim profile (targets/sim/profiles).", **_FRONT),
    _opt("--time-scale", FLOAT, 1.0, "Embedded sim time scale (0 = fastest).", minimum=0, **_FRONT),
    _opt("--replicas", INT, 1, "Embedded engine replicas.", minimum=1, **_FRONT),
    _opt("--router", TEXT, "none", "Embedded router: none, sglang:<policy>, vllm:<policy>.", **_FRONT),
    _opt("--engine", CHOICE, "sim", "Embedded engine.", choices=("sim", "llama-server"), **_FRONT),
    _opt("--llama-parallel", INT, 1, "llama-server slots per replica (--engine llama-server).", minimum=1, **_FRONT),
    _opt("--llama-ctx", INT, 2048, "llama-server KV tokens per replica, shared by its slots.", minimum=64, **_FRONT),
    _opt("--html", FLAG, False, "Also write report.html.", **_FRONT),
    _opt("--quality-gate", FLOAT, None, "Before load, run the quality eval; exit 2 if the score (0-1) is below MIN.", metavar="MIN", **_FRONT),
    _opt("--quality-eval", FILE, None, "Eval set (JSONL) for the quality gate [default: the shipped one].", metavar="FILE", **_FRONT),
    # The master's live /metrics endpoint: process-wide, lives as long as the master (docs/prometheus.md)
    _opt("--prometheus-port", INT, 0, "Serve live metrics for Prometheus at /metrics on this port (0 = off).", commands=frozenset({RUN, MASTER}), check=_port, web_form=False),
    _opt("--prometheus-host", TEXT, "127.0.0.1", "Address of /metrics (0.0.0.0 inside a pod).", commands=frozenset({RUN, MASTER}), web_form=False),
    _opt("--prometheus-linger", DURATION, "0s", "Keep /metrics up this long after the run ends, for a last scrape.", unit="s", commands=frozenset({RUN, MASTER}), web_form=False),
    # Processes
    _opt("--workers", INT, 1, "Local worker processes.", minimum=1, commands=frozenset({RUN, SWEEP}), locust_flag=None),
    _opt("--web", FLAG, False, "Open Locust's web UI (with the LLM tabs) instead of running headless; start each run from its form.", commands=frozenset({RUN}), locust_flag=None),
    _opt("--autostart", FLAG, False, "With --web: start the run at once instead of waiting for the form's start button.", commands=frozenset({RUN}), locust_flag=None),
    _opt("--expect-workers", INT, 1, "Start when this many workers joined.", minimum=1, commands=frozenset({MASTER}), locust_flag=None, required=True),
    _opt("--bind", TEXT, "127.0.0.1", "Address for workers and the web UI (0.0.0.0 for remote workers).", commands=frozenset({MASTER}), locust_flag=None),
    _opt("--master-port", INT, 5557, "Port of the master's channel to its workers (the master binds it, a worker connects to it).", check=_port, commands=frozenset({MASTER, WORKER}), locust_flag=None),
    _opt("--web-port", INT, 8089, "Port of the web UI.", check=_port, commands=frozenset({RUN, MASTER}), locust_flag=None),
    _opt("--headless", FLAG, False, "No web UI: start when the workers joined, exit with the verdict.", commands=frozenset({MASTER}), locust_flag=None),
    _opt("--on-worker-loss", CHOICE, "continue", "What a lost worker does: continue on the others, or abort the run.", choices=("continue", "abort"), commands=frozenset({MASTER}), field="on_worker_loss"),
    _opt("--join-secret-file", TEXT, None, "File holding the join secret a master and its workers share (default: $LOADGEN_JOIN_SECRET); required off loopback.", commands=frozenset({MASTER, WORKER}), locust_flag=None),
    _opt("--allow-unauthenticated-workers", FLAG, False, "Off loopback without a join secret: any client reaching the port joins (recorded in run.json).", commands=frozenset({MASTER}), locust_flag=None),
    # Heartbeats and clocks: process-wide, not per run (loadgen/runtime/loss_timeouts.py, loadgen/engine/worker_clock.py)
    _opt("--worker-loss-timeout", DURATION, f"{DEFAULT_WORKER_LOSS_TIMEOUT_S:g}s", WORKER_LOSS_TIMEOUT_HELP, unit="s", check=_loss_timeout, commands=frozenset({MASTER}), web_form=False),
    _opt("--master-loss-timeout", DURATION, f"{DEFAULT_MASTER_LOSS_TIMEOUT_S:g}s", MASTER_LOSS_TIMEOUT_HELP, unit="s", check=_loss_timeout, commands=frozenset({WORKER}), web_form=False),
    _opt("--max-clock-offset", DURATION, MAX_CLOCK_OFFSET_DEFAULT, MAX_CLOCK_OFFSET_HELP, unit="s", check=_clock_offset, commands=frozenset({MASTER}), web_form=False),
    _opt("--allow-clock-offset", FLAG, False, ALLOW_CLOCK_OFFSET_HELP, commands=frozenset({MASTER}), web_form=False),
    # What the front learned about the target (a JSON file's path): internal plumbing
    _opt("--target-info", TEXT, None, "The front's record of the target (internal).", commands=frozenset(), web_form=False, hidden=True),
)  # fmt: skip

BY_FLAG = {o.flag: o for o in RUN_OPTIONS}
BY_ATTR = {o.attr: o for o in RUN_OPTIONS}


def options_of(command: str) -> tuple[RunOption, ...]:
    """The rows a loadgen command takes, in the table's order (its --help's order)."""
    return tuple(o for o in RUN_OPTIONS if command in o.commands)


def locust_options() -> tuple[RunOption, ...]:
    """The rows Locust's parser takes (the master and local processes; the web form)."""
    return tuple(o for o in RUN_OPTIONS if o.locust is not None)


def option(flag: str) -> RunOption:
    return BY_FLAG[flag]


def _front_fields() -> list[tuple[str, Any, Any]]:
    rows: list[tuple[str, Any, Any]] = []
    for o in RUN_OPTIONS:
        if o.hidden:
            continue
        default = o.default
        if o.kind in (INT, FLOAT) and default is not None:
            default = int(default) if o.kind == INT else float(default)
        rows.append((o.attr, Any, field(default=default)))
    return rows + [(name, Any, value if isinstance(value, Field) else field(default=value)) for name, value in _FRONT_STATE]


RunOptions = make_dataclass(
    "RunOptions",
    _front_fields(),
    namespace={"__doc__": "What a loadgen command collected: one field per row of RUN_OPTIONS it takes "
               "(a duration's or a rate's text as written), plus what a target file or a caller set."},
)  # fmt: skip
RunOptions.__module__ = __name__  # make_dataclass's module= is 3.12+


def check_each(opts: Any, rows: Iterable[RunOption] | None = None) -> None:
    """Check every option's value in ``opts`` (a ``RunOptions``); the first mistake is a UserError."""
    for o in RUN_OPTIONS if rows is None else rows:
        if not o.hidden and hasattr(opts, o.attr):
            o.parse(getattr(opts, o.attr))


def locust_args(opts: Any) -> list[str]:
    """``opts``'s values as Locust flags: every row Locust takes that the front has and that is given
    (the target's URL and ``--target-info`` are the caller's to add)."""
    args: list[str] = []
    for o in locust_options():
        if o.hidden or not hasattr(opts, o.attr):
            continue
        value = getattr(opts, o.attr)
        if o.kind == FLAG:
            args += [o.locust] if value else []
        elif value is not None and value != "":
            args += [o.locust, str(value)]  # str, not :g, which keeps 6 digits (a cost of 1234567.25 became 1.23457e+06)
    return args


def check_session_count(num_sessions: int | None, available: int | None, source: str) -> None:
    """``--num-sessions`` may cut a workload or a trace, never ask for more than it holds."""
    if num_sessions and available is not None and num_sessions > available:
        raise UserError(
            f"--num-sessions {num_sessions}: {source} holds only {available} sessions; ask for at most "
            f"{available}, or leave --num-sessions out to replay it whole"
        )


def resolve_arrival(arrival: str, *, trace_given: bool, has_timestamps: bool, rate_given: bool, trace_time_scale: float) -> str:
    """The arrival process a run uses: ``auto`` becomes ``trace`` (a trace file, or a workload with
    its own timestamps) or ``poisson``; a UserError when the options contradict each other."""
    if arrival == "auto":
        arrival = "trace" if trace_given or has_timestamps else "poisson"
    if arrival == "trace" and not (trace_given or has_timestamps):
        raise UserError(
            "--arrival trace needs --trace FILE or a workload with timestamps (a Mooncake or Azure trace, "
            "or a session file with arrival_s)"
        )
    if arrival == "trace" and rate_given and trace_time_scale != 1.0:
        raise UserError("--rate and --trace-time-scale both rescale the trace; give one of them")
    return arrival


def check_tls_choice(ca_cert: str | None, insecure: bool) -> None:
    if ca_cert and insecure:
        raise UserError("--ca-cert and --insecure contradict each other: give one of them")
