"""loadgen's options inside Locust's own command line (and its web UI start form).

Registered through ``events.init_command_line_parser`` so that the stock
``locust -f <loadgen>/locustfile.py`` accepts them next to every Locust flag: the rows of
``loadgen.runtime.run_options.RUN_OPTIONS`` that Locust takes. The target URL is Locust's own
``--host``. ``config_from_options`` turns parsed options into a validated ``RunConfig``; every
problem is a one-line ``UserError``, written once in the table.
"""

from __future__ import annotations

import argparse
import secrets
import time
from pathlib import Path
from typing import Any

from loadgen.config import RunConfig
from loadgen.errors import UserError
from loadgen.runtime.run_options import (
    DEFAULT_DURATION_S,
    FLAG,
    check_session_count,
    check_tls_choice,
    locust_options,
    resolve_arrival,
)
from loadgen.runtime.run_workload import (
    has_timestamps,
    load_workload_named,
    tokenizer_file_text,
    workload_file_text,
)


def add_arguments(parser: Any) -> None:
    """The table's Locust rows on Locust's parser. Every value is text (a flag is on or off) and
    is checked by the table when a run starts: Locust's web form keeps a value's type, so a
    number typed wrong there is the table's one-line error, not a failed conversion."""
    # parser.add_argument (not a group): only Locust's own add_argument puts an option on the
    # web UI's start form; include_in_web_ui=False keeps internal ones off it.
    for o in locust_options():
        help_text = argparse.SUPPRESS if o.hidden else o.help
        if o.kind == FLAG:
            parser.add_argument(o.locust, action="store_true", default=False, include_in_web_ui=o.web_form, help=help_text)
            continue
        default = "" if o.default is None else (f"{o.default:g}" if isinstance(o.default, float) else str(o.default))
        kw: dict[str, Any] = {"choices": o.choices} if o.choices else {}
        parser.add_argument(o.locust, default=default, include_in_web_ui=o.web_form, help=help_text, **kw)


def new_run_id(workload: str) -> str:
    stem = Path(workload).stem if ("/" in workload or "." in workload) else workload
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{stem}-{secrets.token_hex(2)}"


def config_from_options(options: Any) -> RunConfig:
    """A validated RunConfig from Locust's parsed options; a UserError names the bad flag."""
    host = (getattr(options, "host", None) or "").rstrip("/")
    if not host:
        raise UserError("no target: give --host URL (or use 'loadgen run', which starts a simulated engine)")
    if not host.startswith(("http://", "https://")):
        raise UserError(f"--host {host!r} is not an http(s) URL; use e.g. http://127.0.0.1:8000")
    raw = {o.attr: getattr(options, o.locust_dest, o.default) for o in locust_options()}
    v = {o.attr: o.parse(raw[o.attr]) for o in locust_options()}
    workload = v["workload"] or "agentic-coding"
    num_sessions = v["num_sessions"] or 0
    workload_text = workload_file_text(workload)  # first: a missing file is "no such file"
    # A streamed trace is read only as far as --num-sessions asks (loadgen.engine.plan_stream).
    wl = load_workload_named(workload, v["workload_format"], v["workload_options"] or {}, v["tokenizer"], stream=True)
    available = wl.sessions_available(at_most=num_sessions or 1)
    check_session_count(num_sessions, available, "the workload")
    trace = v["trace"]
    given_arrival = v["arrival"] or "auto"
    has_ts = not trace and given_arrival in ("auto", "trace") and has_timestamps(
        workload, v["workload_format"], v["workload_options"] or {}, v["tokenizer"]
    )
    rate_given = v["rate"] is not None
    arrival = resolve_arrival(
        given_arrival, trace_given=bool(trace), has_timestamps=has_ts, rate_given=rate_given,
        trace_time_scale=v["trace_time_scale"],
    )  # fmt: skip
    duration_s = v["duration"]
    if duration_s is None and not num_sessions and available is None and arrival != "trace":
        # A workload that generates sessions without end runs for the default duration; a trace
        # or a session file (a capture, a dataset) bounds itself and runs whole.
        duration_s = DEFAULT_DURATION_S
    check_tls_choice(v["ca_cert"], v["insecure"])
    # Values the plan holds as the table parsed them, except those with a rule of their own below.
    plan = {o.field: v[o.attr] for o in locust_options() if o.field}
    off_when_zero = ("concurrency", "num_sessions", "cost_per_hour_usd", "first_byte_timeout_s", "idle_timeout_s")
    plan.update({k: plan[k] or None for k in off_when_zero})
    lag_s = v["max_schedule_lag"]
    plan.update(
        run_id=v["run_id"] or new_run_id(workload),
        workload=workload,
        workload_text=workload_text,
        workload_options=v["workload_options"] or {},
        adapter_options=v["adapter_options"] or {},
        tokenizer_json=tokenizer_file_text(v["tokenizer"]) if v["tokenizer"] else None,
        arrival=arrival,
        rate_per_s=v["rate"] if rate_given else 1.0,
        trace_path=trace,
        trace_text=Path(trace).read_text() if arrival == "trace" and trace else None,
        trace_rate_per_s=v["rate"] if arrival == "trace" and rate_given else None,
        duration_s=duration_s,
        target_url=host,
        target_label=v["target_label"] or host.split("://", 1)[1],
        session_header=v["session_header"] or "X-Session-ID",
        target_kind=v["target_kind"] or "openai",
        ca_cert_pem=Path(v["ca_cert"]).read_text() if v["ca_cert"] else None,
        slos=v["slo"] or [],
        max_schedule_lag_us=int((lag_s if lag_s is not None else 0.010) * 1e6),
        max_schedule_lag_explicit=lag_s is not None,
        adapter=v["adapter"] or "openai-chat",
        results_dir=v["results"] or "results",
    )
    plan["seed"] = plan["seed"] or 0
    return RunConfig(**plan)
