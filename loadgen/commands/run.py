"""``loadgen run`` / ``master`` / ``worker``: fill Locust's flags, own the target fleet, run Locust.

Locust runs in a child process (its gevent monkey-patching stays out of this one) that dies with
this process (PR_SET_PDEATHSIG), like every fleet process we start: a killed ``loadgen run``
leaves no orphan on a port. Validation and the target's preflight happen *before* any load.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from loadgen.commands import server_scrape
from loadgen.engine.worker_clock import MAX_CLOCK_OFFSET_DEFAULT, parse_max_clock_offset
from loadgen.errors import UserError
from loadgen.runtime.locust_options import new_run_id
from loadgen.runtime.loss_timeouts import (
    DEFAULT_MASTER_LOSS_TIMEOUT_S,
    DEFAULT_WORKER_LOSS_TIMEOUT_S,
    parse_loss_timeout,
)
from loadgen.runtime.stop_request import STOP_SIGNAL
from loadgen.runtime.verdict import EXIT_CODES, EXIT_INCOMPLETE

LOCUSTFILE = str(Path(__file__).parent.parent / "locustfile.py")  # at its documented path: loadgen/locustfile.py


@dataclass
class RunOptions:
    """What the click front collected; names match the locustfile options."""

    workload: str = "agentic-coding"
    workload_format: str | None = None
    workload_options: str | None = None
    tokenizer: str | None = None
    seed: int = 0
    arrival: str = "auto"
    rate: str | None = None  # None: 1/s, or a trace's own rate
    burstiness: float = 1.0
    trace: str | None = None
    trace_time_scale: float = 1.0
    concurrency: int = 0
    num_sessions: int = 0
    duration: str | None = None
    warmup: str = "0s"
    target: str | None = None
    adapter: str = "openai-chat"
    adapter_options: str | None = None  # key=value,... (loadgen/adapter_options.py)
    model: str | None = None
    api_key_env: str | None = None
    session_header: str | None = None
    target_label: str | None = None
    target_kind: str | None = None
    cost_per_hour: float | None = None
    request_timeout: str = "300s"
    first_byte_timeout: str = "0s"
    idle_timeout: str = "0s"
    retry_after_cap: str = "0s"
    ca_cert: str | None = None
    insecure: bool = False
    stop_timeout: str = "30s"
    slo: str | None = None
    max_schedule_lag: str | None = None  # None: the rule of docs/performance.md
    results: str = "results"
    run_id: str | None = None
    expect_model: str | None = None
    target_file: str | None = None
    target_labels: dict[str, str] = field(default_factory=dict)
    expect: dict[str, str] = field(default_factory=dict)
    # embedded fleet
    profile: str = "h200-llama3-8b-fp8"
    time_scale: float = 1.0
    replicas: int = 1
    router: str = "none"
    engine: str = "sim"
    llama_parallel: int = 1  # llama-server --parallel (slots per replica)
    llama_ctx: int = 2048  # llama-server --ctx-size (KV tokens per replica, shared by its slots)
    # processes
    workers: int = 1
    web: bool = False
    web_host: str = "127.0.0.1"
    web_port: int = 8089
    on_worker_loss: str = "continue"
    # distributed master (workers connect over Locust's ZeroMQ channel)
    master: bool = False
    expect_workers: int = 1
    bind: str = "127.0.0.1"
    master_port: int = 5557
    headless: bool = True
    # who may join (loadgen/runtime/join_auth.py): the secret is read from $LOADGEN_JOIN_SECRET or this file
    join_secret_file: str | None = None
    allow_unauthenticated_workers: bool = False
    worker_loss_timeout: str = f"{DEFAULT_WORKER_LOSS_TIMEOUT_S:g}s"  # a worker silent this long is lost
    # a worker whose clock is off by more than this is refused before load (loadgen/engine/worker_clock.py)
    max_clock_offset: str = MAX_CLOCK_OFFSET_DEFAULT
    allow_clock_offset: bool = False
    # the master's Prometheus endpoint (loadgen/live/metrics_endpoint.py); 0 = off
    prometheus_port: int = 0
    prometheus_host: str = "127.0.0.1"
    prometheus_linger: str = "0s"
    html: bool = False
    quiet: bool = False
    # quality gate before load (loadgen/commands/quality.py): refuse the run below this score
    quality_gate: float | None = None
    quality_eval: str | None = None
    extra_locust_args: list[str] = field(default_factory=list)


def validate(opts: RunOptions) -> None:
    """Everything checkable without a server, so bad input fails before any process starts."""
    if opts.target_file:
        from loadgen.target_file import apply_target_file, load_target_file

        apply_target_file(opts, load_target_file(opts.target_file))
    if opts.expect_model:
        opts.expect = {**opts.expect, "model": opts.expect_model}
    from analysis.units import parse_duration_s, parse_rate_per_s
    from loadgen.runtime.run_workload import load_workload_named, parse_options_flag

    workload = load_workload_named(
        opts.workload, opts.workload_format, parse_options_flag(opts.workload_options or ""), opts.tokenizer, stream=True
    )
    for flag, value, parse in (
        ("--rate", opts.rate, parse_rate_per_s),
        ("--duration", opts.duration, parse_duration_s),
        ("--warmup", opts.warmup, parse_duration_s),
        ("--request-timeout", opts.request_timeout, parse_duration_s),
        ("--first-byte-timeout", opts.first_byte_timeout, parse_duration_s),
        ("--idle-timeout", opts.idle_timeout, parse_duration_s),
        ("--retry-after-cap", opts.retry_after_cap, parse_duration_s),
        ("--stop-timeout", opts.stop_timeout, parse_duration_s),
        ("--max-schedule-lag", opts.max_schedule_lag, parse_duration_s),
    ):
        if value is None:
            continue
        try:
            parse(value)
        except ValueError as e:
            raise UserError(f"{flag}: {e}") from None
    if opts.slo:
        from analysis.slo import parse_slos

        try:
            parse_slos(opts.slo)
        except ValueError as e:
            raise UserError(f"--slo: {e}") from None
    if opts.api_key_env and opts.api_key_env not in os.environ:
        raise UserError(f"--api-key-env {opts.api_key_env}: that environment variable is not set")
    if opts.ca_cert or opts.insecure:
        from targets.errors import TargetError
        from targets.tls import tls_context

        try:
            tls_context(opts.ca_cert, opts.insecure)
        except TargetError as e:
            raise UserError(str(e)) from None
    if opts.workers < 1:
        raise UserError(f"--workers {opts.workers}: must be at least 1")
    if opts.master:
        parse_loss_timeout("--worker-loss-timeout", opts.worker_loss_timeout)
        try:
            parse_max_clock_offset(opts.max_clock_offset)
        except ValueError as e:
            raise UserError(f"--max-clock-offset: {e}") from None
    from loadgen.runtime.locust_options import check_positive, check_session_count

    check_positive("--trace-time-scale", opts.trace_time_scale, "it multiplies the trace's gaps: 0.5 replays twice as fast")
    check_positive("--burstiness", opts.burstiness, "1 = Poisson, < 1 burstier")
    if opts.num_sessions < 0 or opts.concurrency < 0:
        raise UserError("--num-sessions and --concurrency must be 0 or more")
    available = workload.sessions_available(at_most=opts.num_sessions or 1)  # a streamed trace: read that far
    check_session_count(opts.num_sessions, available, f"--workload {opts.workload}")
    if opts.trace:
        from workloads import arrivals
        from workloads.errors import WorkloadError

        try:
            rows = len(arrivals.trace(opts.trace))
        except WorkloadError as e:
            raise UserError(f"--trace: {e}") from None
        check_session_count(opts.num_sessions, rows, f"--trace {opts.trace}")
    from loadgen.runtime.results_writer import check_writable

    check_writable(opts.results)
    if opts.prometheus_port:
        from loadgen.live.metrics_endpoint import check_bindable

        check_bindable(opts.prometheus_host, opts.prometheus_port)
    if opts.arrival == "trace" and not opts.trace and not workload.has_arrival_times():
        raise UserError(
            "--arrival trace needs --trace FILE or a workload with timestamps (a Mooncake or Azure trace, "
            "or a session file with arrival_s)"
        )
    if opts.rate is not None and opts.trace_time_scale != 1.0:
        arrival = opts.arrival
        if arrival == "trace" or (arrival == "auto" and (opts.trace or workload.has_arrival_times())):
            raise UserError("--rate and --trace-time-scale both rescale the trace; give one of them")
    from loadgen.adapter_options import checked_adapter, parse_adapter_options

    checked_adapter(opts.adapter, parse_adapter_options(opts.adapter_options or ""))
    if opts.quality_gate is not None or opts.quality_eval:
        from loadgen.commands.quality import validate_gate

        validate_gate(opts.quality_gate, opts.quality_eval)


def locust_args(opts: RunOptions, url: str, target_info_path: str | None) -> list[str]:
    """loadgen's options as Locust command-line flags (see loadgen/runtime/locust_options.py)."""
    args = [
        "--host", url,
        "--workload", opts.workload,
        "--seed", str(opts.seed),
        "--arrival", opts.arrival,
        "--burstiness", str(opts.burstiness),
        "--trace-time-scale", str(opts.trace_time_scale),
        "--concurrency", str(opts.concurrency),
        "--num-sessions", str(opts.num_sessions),
        "--warmup", opts.warmup,
        "--adapter", opts.adapter,
        "--request-timeout", opts.request_timeout,
        "--first-byte-timeout", opts.first_byte_timeout,
        "--idle-timeout", opts.idle_timeout,
        "--retry-after-cap", opts.retry_after_cap,
        "--loadgen-stop-timeout", opts.stop_timeout,
        "--results", opts.results,
        "--on-worker-loss", opts.on_worker_loss,
    ]  # fmt: skip
    optional = {
        "--rate": None if opts.rate is None else str(opts.rate),
        "--workload-format": opts.workload_format,
        "--workload-options": opts.workload_options,
        "--adapter-options": opts.adapter_options,
        "--tokenizer": opts.tokenizer,
        "--trace": opts.trace,
        "--duration": opts.duration,
        "--model": opts.model,
        "--api-key-env": opts.api_key_env,
        "--session-header": opts.session_header,
        "--target-label": opts.target_label,
        "--target-kind": opts.target_kind,
        "--cost-per-hour": None if opts.cost_per_hour is None else str(opts.cost_per_hour),
        "--slo": opts.slo,
        "--max-schedule-lag": opts.max_schedule_lag,
        "--run-id": opts.run_id,
        "--target-info": target_info_path,
        "--ca-cert": opts.ca_cert,
    }
    for flag, value in optional.items():
        if value:
            args += [flag, value]
    if opts.insecure:
        args.append("--insecure")
    if opts.prometheus_port:
        args += ["--prometheus-port", str(opts.prometheus_port), "--prometheus-host", opts.prometheus_host]
        args += ["--prometheus-linger", opts.prometheus_linger]
    return args


def master_died(code: int, run_dir: Path) -> int:
    """The Locust master ended without a verdict (killed, or crashed): say so as the verdict, mark
    the run aborted in run.json if it still says running, and return exit 5."""
    how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code} and no verdict"
    where = ""
    run_json = run_dir / "run.json"
    if run_json.exists():
        where = f"; what it recorded up to then is in {run_dir} ('loadgen report {run_dir}' reads a partial run)"
        try:
            info = orjson.loads(run_json.read_bytes())
            if info.get("status") == "running":
                from loadgen.runtime.results_writer import write_json_atomic

                info.update(status="aborted", abort_reason=f"the Locust master {how}")
                write_json_atomic(run_json, info)
        except (OSError, orjson.JSONDecodeError):
            pass
    print(f"loadgen verdict: FAIL (exit {EXIT_INCOMPLETE}): run incomplete: the Locust master {how}{where}", file=sys.stderr, flush=True)
    return EXIT_INCOMPLETE


def _die_with_parent() -> None:
    # Children die with us even on kill -9: no orphan keeps a port or keeps sending load.
    from targets.fleet.procs import die_with_parent

    die_with_parent(signal.SIGTERM)


def _master_preexec() -> None:
    _die_with_parent()
    # Both survive exec. SIGINT is ignored by the master and the workers it forks: a terminal's
    # Ctrl-C reaches the whole process group, and only the stop request this process sends is to
    # stop the run. The request is ignored until the master's runtime takes it (STOP_SIGNAL).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(STOP_SIGNAL, signal.SIG_IGN)


def run_locust(argv: list[str], *, master: bool = False, env: dict[str, str] | None = None) -> int:
    """Run Locust with ``argv`` in a child process, forward SIGINT/SIGTERM, return its exit code.

    A ``master`` is asked to stop with ``STOP_SIGNAL`` for either (``loadgen.runtime.stop_request`` says
    why not SIGINT or SIGTERM: with SIGINT a finished ``--web`` run now and then went on serving
    until killed, and a terminal's Ctrl-C, which every process of the group gets, cut the stop's
    handlers short in the master and the workers, with exit codes 0, 1 or 254 for the same stop).
    A second Ctrl-C or SIGTERM kills the master: a stop that hangs is not waited on twice. A
    ``loadgen worker`` keeps SIGINT: a ``--processes`` worker parent waits for its children on
    the first one.
    """
    cmd = [sys.executable, "-m", "locust", "-f", LOCUSTFILE, *argv]
    # stdin: Locust reads keys (w, s, ...) from a terminal; a run never takes input that way.
    preexec = _master_preexec if master else _die_with_parent
    proc = subprocess.Popen(cmd, preexec_fn=preexec, stdin=subprocess.DEVNULL, env=env)
    forwarded = []

    def forward(signum: int, _frame: Any) -> None:
        if proc.poll() is not None:
            return
        if not master:
            proc.send_signal(signal.SIGTERM if signum == signal.SIGTERM else signal.SIGINT)
        elif forwarded:
            proc.kill()
        else:
            forwarded.append(signum)
            proc.send_signal(STOP_SIGNAL)

    old_int = signal.signal(signal.SIGINT, forward)
    old_term = signal.signal(signal.SIGTERM, forward)
    try:
        return proc.wait()
    finally:
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)


@contextmanager
def target_for(opts: RunOptions) -> Iterator[tuple[str, dict[str, Any]]]:
    """The URL to load and what to record about it: the given target, or an embedded fleet."""
    if opts.target:
        yield opts.target.rstrip("/"), {}
        return
    from targets.fleet import start_fleet

    try:
        fleet = start_fleet(
            replicas=opts.replicas,
            engine=opts.engine,
            profile=opts.profile,
            time_scale=opts.time_scale,
            seed=opts.seed,
            router=opts.router,
            llama_parallel=opts.llama_parallel,
            llama_ctx=opts.llama_ctx,
            sim_args=_sim_answers(opts),
        )
    except ValueError as e:
        raise UserError(str(e)) from None
    try:
        info: dict[str, Any] = {"kind": "router" if opts.router != "none" else opts.engine, "fleet": fleet.describe()}
        info["cold_start"] = [c.as_dict() for c in fleet.cold_starts()]
        if not opts.target_label:
            # A stable label (not the random port) so arms and reruns line up in comparisons.
            opts.target_label = opts.engine if opts.router == "none" else opts.router.replace(":", "-")
        if fleet.session_header and not opts.session_header:
            opts.session_header = fleet.session_header
        if not opts.quiet:
            print(f"embedded fleet: {fleet.url} ({fleet.summary_line()})", file=sys.stderr, flush=True)
        yield fleet.url, info
    finally:
        fleet.stop()


def _sim_answers(opts: RunOptions) -> list[str]:
    """An embedded sim is told the quality eval's answers: the gate then checks the plumbing."""
    if opts.quality_gate is None and not opts.quality_eval:
        return []
    from loadgen.commands.quality import sim_answers_file

    return ["--answers", sim_answers_file(opts.quality_eval)]


def preflight(opts: RunOptions, url: str, replica_urls: list[str] | None = None) -> dict[str, Any]:
    """Reach the target, check it streams, check its identity; a one-line UserError otherwise.

    Behind an embedded router (``replica_urls``), identity is the replicas': a router names no
    model of its own (sglang-router's ``/v1/models`` says ``unknown``), so every replica is read
    and checked, and the first one's identity is recorded with the router's URL.
    """
    from loadgen.engine.preflight import preflight as target_preflight
    from targets.errors import TargetError
    from targets.identity import check_expected, read_identity
    from targets.registry import get_adapter
    from targets.tls import INSECURE_WARNING, tls_context

    try:
        adapter = get_adapter(opts.adapter)
        api_key = os.environ.get(opts.api_key_env) if opts.api_key_env else None
        tls = tls_context(opts.ca_cert, opts.insecure) if url.startswith("https:") else None
        if opts.insecure and not opts.quiet:
            print(f"warning: {INSECURE_WARNING}", file=sys.stderr, flush=True)
        from analysis.units import parse_duration_s

        # One deadline for the whole preflight: its own 10 s, capped by the run's request timeout;
        # the run's first-byte and idle timeouts bound its headers and its body's silences alike.
        target_preflight(
            url, adapter, model=opts.model, api_key=api_key, timeout_s=10.0, ssl_context=tls,
            request_timeout_s=parse_duration_s(opts.request_timeout) or None,
            first_byte_timeout_s=parse_duration_s(opts.first_byte_timeout) or None,
            idle_timeout_s=parse_duration_s(opts.idle_timeout) or None,
        )  # fmt: skip
        identity = read_identity(url, opts.adapter, timeout_s=5.0, ssl_context=tls, api_key=api_key)
        engines = [identity]
        if replica_urls and replica_urls != [url]:
            engines = [
                read_identity(u, opts.adapter, timeout_s=5.0, ssl_context=tls, api_key=api_key) for u in replica_urls
            ]
            identity = {**engines[0], "base_url": url, "replica_urls": replica_urls}
        if opts.expect:
            for engine in engines:
                check_expected(engine, opts.expect, url=engine["base_url"])
    except TargetError as e:
        raise UserError(str(e)) from None
    return identity


def process_args(opts: RunOptions) -> list[str]:
    """Locust flags for the process layout: local, local workers, or a distributed master."""
    argv = ["--loglevel", os.environ.get("LOADGEN_LOGLEVEL", "WARNING"), "--only-summary"]
    # Locust's own request table, saved rather than printed (Locust adds the .json suffix).
    argv += ["--json-file", str(Path(opts.results) / (opts.run_id or "run") / "locust-stats")]
    if opts.master:
        n = str(opts.expect_workers)
        argv += ["--master", "--expect-workers", n, "--master-bind-host", opts.bind, "--master-bind-port", str(opts.master_port)]
        argv += ["--worker-loss-timeout", opts.worker_loss_timeout, "--max-clock-offset", opts.max_clock_offset]
        argv += ["--allow-clock-offset"] if opts.allow_clock_offset else []
        users = n
    else:
        # Always a master and worker process(es), even for one worker: merging, writing results
        # and the progress line then never stall the event loop that timestamps tokens.
        # A free loopback port, not Locust's 5557: two runs on one machine must not collide.
        from targets.fleet.procs import free_port

        port = str(free_port())
        argv += ["--processes", str(opts.workers), "--master-bind-host", "127.0.0.1", "--master-bind-port", port]
        argv += ["--master-host", "127.0.0.1", "--master-port", port]
        users = str(opts.workers)
    argv += ["-u", users, "-r", users]
    if opts.web or (opts.master and not opts.headless):
        host = opts.bind if opts.master else opts.web_host
        argv += ["--web-host", host, "--web-port", str(opts.web_port)]
        if not opts.master:
            argv += ["--autostart"]
    else:
        argv += ["--headless"]
    return argv


def join_env(secret: str | None, *, allow_unauthenticated: bool = False) -> dict[str, str]:
    """The Locust process's environment: the join secret travels there, never on a command line."""
    from loadgen.runtime.join_auth import ALLOW_ENV, SECRET_ENV

    env = {k: v for k, v in os.environ.items() if k not in (SECRET_ENV, ALLOW_ENV)}
    if secret is not None:
        env[SECRET_ENV] = secret
    elif allow_unauthenticated:
        env[ALLOW_ENV] = "1"
    return env


def master_join_env(opts: RunOptions) -> dict[str, str]:
    """A distributed master's join secret, checked before anything starts (a usage error, exit 2,
    when it binds off loopback with neither a secret nor --allow-unauthenticated-workers)."""
    from loadgen.runtime.join_auth import UNAUTHENTICATED_WARNING, master_secret

    secret = master_secret(opts.bind, opts.join_secret_file, opts.allow_unauthenticated_workers)
    if secret is None and opts.allow_unauthenticated_workers:
        print(f"warning: {UNAUTHENTICATED_WARNING}", file=sys.stderr, flush=True)
    return join_env(secret, allow_unauthenticated=opts.allow_unauthenticated_workers)


def run_worker(
    master_host: str,
    master_port: int,
    processes: int = 1,
    join_secret_file: str | None = None,
    master_loss_timeout: str = f"{DEFAULT_MASTER_LOSS_TIMEOUT_S:g}s",
) -> int:
    """``loadgen worker``: a Locust worker that takes its whole plan from the master."""
    from loadgen.runtime.join_auth import read_secret

    parse_loss_timeout("--master-loss-timeout", master_loss_timeout)
    env = join_env(read_secret(join_secret_file))
    argv = ["--worker", "--master-host", master_host, "--master-port", str(master_port), "--loglevel", "WARNING"]
    argv += ["--master-loss-timeout", master_loss_timeout]
    if processes > 1:
        argv += ["--processes", str(processes)]
    return run_locust(argv, env=env)


def run(opts: RunOptions) -> int:
    """``loadgen run``: the whole job. Returns the process exit code (see loadgen/runtime/verdict.py)."""
    env = master_join_env(opts) if opts.master else None
    validate(opts)
    if not opts.run_id:
        opts.run_id = new_run_id(opts.workload)
    with target_for(opts) as (url, info):
        identity = preflight(opts, url, [r["url"] for r in (info.get("fleet") or {}).get("replicas", [])])
        info["identity"] = {**identity, **info.get("identity", {})}
        if opts.target_labels:
            info["labels"] = opts.target_labels
        if opts.expect:
            info["expect"] = opts.expect
        if opts.quality_gate is not None or opts.quality_eval:
            from loadgen.commands.quality import gate_before_load

            gate_before_load(opts, url, info)
        with tempfile.NamedTemporaryFile("wb", suffix=".json", prefix="loadgen-target-", delete=False) as f:
            f.write(orjson.dumps(info))
            info_path = f.name
        metrics_urls = server_scrape.endpoints(url, info)
        before = server_scrape.snapshot(metrics_urls)
        try:
            argv = locust_args(opts, url, info_path) + process_args(opts)
            argv += opts.extra_locust_args
            code = run_locust(argv, master=True, env=env)
        finally:
            os.unlink(info_path)
        run_dir = Path(opts.results) / opts.run_id
        if code not in EXIT_CODES:
            code = master_died(code, run_dir)
        if run_dir.is_dir():
            try:
                server_scrape.write(run_dir, metrics_urls, before, server_scrape.snapshot(metrics_urls))
            except OSError:
                pass  # a full or read-only disk: the run already stopped on it, and its verdict stays the last line
    if opts.html and (run_dir / "run.json").exists():
        from analysis.report import write_report

        path = write_report(run_dir)
        print(f"report: {path}", file=sys.stderr)
    return code
