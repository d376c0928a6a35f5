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
from pathlib import Path
from typing import Any

import orjson

from loadgen.commands import power_scrape, server_scrape
from loadgen.errors import UserError
from loadgen.runtime.locust_options import new_run_id
from loadgen.runtime.loss_timeouts import DEFAULT_MASTER_LOSS_TIMEOUT_S, parse_loss_timeout
from loadgen.runtime.run_options import (
    RunOptions,
    check_each,
    check_session_count,
    check_tls_choice,
    resolve_arrival,
)
from loadgen.runtime.run_options import locust_args as table_locust_args
from loadgen.runtime.stop_request import STOP_SIGNAL
from loadgen.runtime.verdict import EXIT_CODES, EXIT_INCOMPLETE

LOCUSTFILE = str(Path(__file__).parent.parent / "locustfile.py")  # at its documented path: loadgen/locustfile.py


def validate(opts: RunOptions) -> None:
    """Everything checkable without a server, so bad input fails before any process starts: each
    option by its row of the table (``loadgen.runtime.run_options``), then what joins several."""
    if opts.target_file:
        from loadgen.target_file import apply_target_file, load_target_file

        apply_target_file(opts, load_target_file(opts.target_file))
    if opts.expect_model:
        opts.expect = {**opts.expect, "model": opts.expect_model}
    check_each(opts)
    if opts.autostart and not opts.web:
        raise UserError("--autostart starts a --web run at once; without --web a run always starts at once")
    from loadgen.runtime.run_workload import load_workload_named, parse_options_flag

    workload = load_workload_named(
        opts.workload, opts.workload_format, parse_options_flag(opts.workload_options or ""), opts.tokenizer, stream=True
    )
    check_tls_choice(opts.ca_cert, opts.insecure)
    power_scrape.check(opts)
    if opts.ca_cert or opts.insecure:
        from targets.tls import tls_context

        tls_context(opts.ca_cert, opts.insecure)
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
    resolve_arrival(
        opts.arrival, trace_given=bool(opts.trace), has_timestamps=workload.has_arrival_times(),
        rate_given=opts.rate is not None, trace_time_scale=opts.trace_time_scale,
    )  # fmt: skip
    from loadgen.adapter_options import checked_adapter, parse_adapter_options

    checked_adapter(opts.adapter, parse_adapter_options(opts.adapter_options or ""))
    if opts.quality_gate is not None or opts.quality_eval:
        from loadgen.commands.quality import validate_gate

        validate_gate(opts.quality_gate, opts.quality_eval)


def locust_args(opts: RunOptions, url: str, target_info_path: str | None) -> list[str]:
    """loadgen's options as Locust command-line flags (the table's rows that Locust takes)."""
    args = ["--host", url, *table_locust_args(opts)]
    if target_info_path:
        args += ["--target-info", target_info_path]
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
        if not opts.master and opts.autostart:
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
        power = None
        try:
            power = power_scrape.start(opts, info)  # GPU power each second while the load runs
            argv = locust_args(opts, url, info_path) + process_args(opts)
            argv += opts.extra_locust_args
            if opts.web:
                start = "the run starts now" if opts.autostart else "start each run from its form"
                print(
                    f"loadgen: web UI at http://{opts.web_host}:{opts.web_port} ({start}; each run's verdict and "
                    "report appear there when it ends; Ctrl-C ends the process, its exit code the last run's verdict)",
                    file=sys.stderr, flush=True,
                )  # fmt: skip
            code = run_locust(argv, master=True, env=env)
        finally:
            os.unlink(info_path)
            if power is not None:
                power.stop()
        run_dir = Path(opts.results) / opts.run_id
        if code not in EXIT_CODES:
            code = master_died(code, run_dir)
        if run_dir.is_dir():
            try:
                server_scrape.write(run_dir, metrics_urls, before, server_scrape.snapshot(metrics_urls))
            except OSError:
                pass  # a full or read-only disk: the run already stopped on it, and its verdict stays the last line
            power_scrape.report(power)
    if opts.html and (run_dir / "run.json").exists():
        from analysis.report import write_report

        path = write_report(run_dir)
        print(f"report: {path}", file=sys.stderr)
    return code
