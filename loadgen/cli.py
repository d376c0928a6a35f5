"""The ``loadgen`` command line. Each command parses flags and calls one function."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import click

from analysis.units import DURATION_FORM, RATE_FORM, parse_duration_s, parse_rate_per_s
from loadgen.errors import USAGE_EXIT_CODE, UserError, as_user_error
from loadgen.runtime.run_options import AB, FLAG, MASTER, RUN, SWEEP, WORKER, RunOption, options_of


class _Parsed(click.ParamType):
    """A click type that validates with ``parse`` but passes the user's text on unchanged."""

    def __init__(self, name: str, parse: Callable[[str], Any], form: str) -> None:
        self.name = name
        self._parse = parse
        self._form = form

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        try:
            self._parse(value)
        except ValueError:
            self.fail(f"{value!r} is not a {self.name}; use {self._form}", param, ctx)
        return str(value)


DURATION = _Parsed("duration", parse_duration_s, DURATION_FORM)
RATE = _Parsed("rate", parse_rate_per_s, RATE_FORM)


class _TableValue(click.ParamType):
    """A click type that checks a value with its row of the options table: the same one-line
    message (``Error: --rate: ...``, exit 2) as the Locust process gives for the same mistake."""

    def __init__(self, row: RunOption) -> None:
        self.row = row
        self.name = row.kind

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        try:
            return self.row.front_value(value)
        except UserError as e:
            raise UsageFailure(e.message) from None


def table_options(command: str) -> Callable[[Callable], Callable]:
    """The click options of ``command``: its rows of ``loadgen.runtime.run_options.RUN_OPTIONS``."""

    def decorate(f: Callable) -> Callable:
        for row in reversed(options_of(command)):
            if row.kind == FLAG:
                f = click.option(row.flag, is_flag=True, help=row.help)(f)
                continue
            metavar = row.metavar or (f"[{'|'.join(row.choices)}]" if row.choices else None)
            f = click.option(
                row.flag, type=_TableValue(row), default=row.default, required=row.required, metavar=metavar,
                show_default=row.default is not None and not row.required, help=row.help,
            )(f)  # fmt: skip
        return f

    return decorate


def _run_options(kwargs: dict[str, Any]) -> Any:
    from loadgen.commands.run import RunOptions

    return RunOptions(**kwargs)


class UsageFailure(click.ClickException):
    """A ``UserError`` as click prints it: ``Error: <message>`` on one line, exit 2."""

    exit_code = USAGE_EXIT_CODE


class LoadgenGroup(click.Group):
    """The command group that turns a user error raised anywhere below it into one line
    (``loadgen.errors.as_user_error``: a ``UserError``, or a library's error for bad input)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.ClickException:
            raise
        except Exception as e:
            user = as_user_error(e)
            if user is None:
                raise
            raise UsageFailure(user.message) from e


@click.group(cls=LoadgenGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="loadgen")
def main() -> None:
    """loadgen: load generation for LLM inference fleets."""


@main.command()
@table_options(RUN)
def run(**kwargs: Any) -> None:
    """Run a workload against a target (or an embedded simulated engine) and report."""
    from loadgen.commands.run import run as run_load

    sys.exit(run_load(_run_options(kwargs)))


@main.command()
@table_options(MASTER)
def master(**kwargs: Any) -> None:
    """Run as the master of a distributed run; workers join with 'loadgen worker'."""
    from loadgen.commands.run import run as run_load

    sys.exit(run_load(_run_options({**kwargs, "master": True})))


@main.command()
@click.option("--master-host", required=True, help="Address of 'loadgen master'.")
@click.option("--processes", type=click.IntRange(min=1), default=1, show_default=True, help="Worker processes on this machine.")
@table_options(WORKER)
def worker(master_host: str, master_port: int, processes: int, join_secret_file: str | None, master_loss_timeout: str) -> None:
    """Run a worker; it takes its plan (workload, rate, target, seed) from the master."""
    from loadgen.commands.run import run_worker

    sys.exit(run_worker(master_host, master_port, processes, join_secret_file, master_loss_timeout))


@main.command()
@table_options(AB)
@click.option("--arms", required=True, help="NAME=ROUTER,... e.g. rr=sglang:round_robin,ca=sglang:cache_aware")
@click.option("--predict/--no-predict", default=True, show_default=True, help="With --engine llama-server: also run the arms on sims fitted to the replicas, and compare.")
def ab(arms: str, predict: bool, **kwargs: Any) -> None:
    """Run the same seeded workload once per arm, each on a fresh fleet, and compare side by side."""
    from loadgen.commands.ab import parse_arms, report_ab, run_ab

    parsed = parse_arms(arms)
    opts = _run_options(kwargs)
    if predict and opts.engine == "llama-server":
        from loadgen.commands.predict import report_prediction, run_ab_with_prediction

        result = run_ab_with_prediction(parsed, opts)
        click.echo(report_ab([a[0] for a in parsed], result.real))
        click.echo("\n" + report_prediction([a[0] for a in parsed], result))
        sys.exit(result.code)
    code, dirs = run_ab(parsed, opts)
    click.echo(report_ab([a[0] for a in parsed], dirs))
    sys.exit(code)


@main.command()
@click.option("--quick", is_flag=True, help="A shorter run (fewer sessions) for a smoke test.")
@click.option("--results", default="results", show_default=True)
@click.option("--engine", type=click.Choice(["sim", "llama-server"]), default="sim", show_default=True, help="llama-server: real replicas (SmolLM2 on the CPU), a smaller workload, and the sim's prediction beside it.")
@click.option("--max-schedule-lag", default=None, help="Bound on the generator's schedule-lag p99 (default: 50ms for the sim, 200ms for llama-server).")
def demo(quick: bool, results: str, engine: str, max_schedule_lag: str | None) -> None:
    """Round-robin vs cache-aware routing on two replicas (simulated laptop ones by default) behind sglang-router.

    Exits 0 when the expected shape is met, 3 when it is not; a failed arm's own code first.
    """
    from loadgen.commands.demo import run_demo

    sys.exit(run_demo(quick=quick, results=results, engine=engine, max_schedule_lag=max_schedule_lag))


@main.command()
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--html", is_flag=True, help="Also write report.html.")
@click.option("--csv", "csv_path", default=None, help="Also write the summary as CSV to this file.")
@click.option("--slo", default=None, help="Per-request and percentile SLOs to evaluate.")
@click.option("--cost-per-hour", type=float, default=None)
def report(run_dir: str, html: bool, csv_path: str | None, slo: str | None, cost_per_hour: float | None) -> None:
    """Summarise a results directory (complete or partial) and write summary.json."""
    from loadgen.commands.report import report_run

    report_run(run_dir, html=html, csv_path=csv_path, slo=slo, cost_per_hour=cost_per_hour)


@main.command()
@click.argument("a", type=click.Path(file_okay=False))
@click.argument("b", type=click.Path(file_okay=False))
@click.option("--force", is_flag=True, help="Compare runs whose seed or workload differ (unpaired).")
@click.option("--md", is_flag=True, help="Print Markdown (for a pull request or CI summary) instead of the table.")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON instead of the table.")
@click.option("--svg", default=None, metavar="FILE", help="Write A's and B's CDFs overlaid (see --svg-metric).")
@click.option("--svg-metric", default="ttft", show_default=True, metavar="METRIC[@TURNS]", help="e.g. ttft@follow-up, itl.")
@click.option("--html", default=None, metavar="FILE", help="Write the HTML comparison report.")
@click.option("--stat", type=click.Choice(["p50", "p90", "p95", "p99", "mean"]), default="p95", show_default=True, help="Statistic of the verdict lines.")
@click.option("--min-effect", default="5%", show_default=True, help="Smaller changes of B/A are noise, not significant.")
@click.option("--n-boot", type=click.IntRange(min=100), default=2000, show_default=True, help="Bootstrap resamples.")
def compare(a: str, b: str, **kwargs: Any) -> None:
    """Compare run B against baseline A with bootstrap intervals (paired when the seed matches)."""
    from loadgen.commands.compare import compare as compare_runs

    sys.exit(compare_runs(a, b, **kwargs))


@main.command()
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--baseline", default=None, type=click.Path(file_okay=False), help="The run to compare against.")
@click.option("--max-regression", default=None, help="e.g. ttft_p99=10%,itl_p95@follow-up=5% (needs --baseline).")
@click.option("--slo", default=None, help="Percentile SLOs the run must hold (default: the run's own).")
@click.option("--min-attainment", default=None, help="Least per-request SLO attainment, e.g. 99%.")
@click.option("--max-error-rate", default=None, help="Most errors allowed, e.g. 1%.")
@click.option("--force", is_flag=True, help="Allow a baseline with another seed or workload (unpaired).")
@click.option("--n-boot", type=click.IntRange(min=100), default=2000, show_default=True, help="Bootstrap resamples.")
def gate(run_dir: str, **kwargs: Any) -> None:
    """CI gate: exit 3 when RUN_DIR misses an SLO or regressed beyond noise against --baseline."""
    from loadgen.commands.compare import gate as judge

    sys.exit(judge(run_dir, **kwargs))


@main.command()
@table_options(SWEEP)
@click.option("--rates", default=None, help="Grid: run each rate, e.g. 1,2,4,8 (sessions/s).")
@click.option("--search", is_flag=True, help="Bisect between --min-rate and --max-rate for the max rate.")
@click.option("--min-rate", type=RATE, default=None, help="Lowest rate of --search.")
@click.option("--max-rate", type=RATE, default=None, help="Highest rate of --search.")
@click.option("--steps", type=click.IntRange(min=1, max=20), default=6, show_default=True, help="Halvings of --search.")
@click.option("--max-error-rate", default="1%", show_default=True, help="A rate with more errors does not hold.")
def sweep(**kwargs: Any) -> None:
    """Find the largest arrival rate that holds the --slo percentile SLOs: a grid or a bisection of runs."""
    from loadgen.commands.sweep import run_sweep_command

    ctx = click.get_current_context()
    rate_given = ctx.get_parameter_source("rate") is not click.core.ParameterSource.DEFAULT
    sys.exit(run_sweep_command(kwargs, rate_given=rate_given))


@main.command()
@click.option("--target", required=True, help="Base URL of the server, e.g. http://127.0.0.1:8000.")
@click.option("--model", default=None, help="Model name to send.")
@click.option("--eval", "eval_file", default=None, metavar="FILE", help="Eval set (JSONL) [default: the shipped one].")
@click.option("--adapter", default="openai-chat", show_default=True, help="API flavour (loadgen.targets entry points).")
@click.option("--api-key-env", default=None, help="Environment variable that holds the API key.")
@click.option("--min-score", type=float, default=None, metavar="MIN", help="Exit 2 when the score (0-1) is below MIN.")
@click.option("--ca-cert", type=click.Path(exists=True, dir_okay=False), default=None, help="PEM certificates to trust for an https:// target.")
@click.option("--insecure", is_flag=True, help="https:// without certificate checks.")
def quality(target: str, model: str | None, eval_file: str | None, adapter: str, api_key_env: str | None,
            min_score: float | None, ca_cert: str | None, insecure: bool) -> None:  # fmt: skip
    """Ask the target a small exact-match eval (greedy) and print each answer and the score."""
    from loadgen.commands.quality import run_quality_command

    sys.exit(run_quality_command(target, model=model, eval_file=eval_file, adapter=adapter, api_key_env=api_key_env,
                                 min_score=min_score, ca_cert=ca_cert, insecure=insecure))  # fmt: skip


@main.command()
@click.option("--listen", default="127.0.0.1:8001", show_default=True, help="HOST:PORT to serve on (port 0 picks one).")
@click.option("--upstream", required=True, help="Base URL of the real server, e.g. http://127.0.0.1:8000.")
@click.option("--out", required=True, help="Session file (.jsonl) to write; must be new or empty.")
@click.option("--session-header", default="X-Session-ID", show_default=True, help="Header that names the session.")
@click.option("--redact", is_flag=True, help="Replace all text with filler of the same length and token count.")
@click.option("--idle-timeout", type=DURATION, default="300s", show_default=True, help="A session this idle is closed and written.")
@click.option("--tenant", default="default", show_default=True, help="Tenant written on every session.")
@click.option("--anonymize", is_flag=True, help="Write no text: each turn's tokens as prefix-chained block hashes (salted per file).")
@click.option("--block-size", type=click.IntRange(min=1), default=None, help="Tokens per block id with --anonymize [default: 512].")
@click.option("--anonymize-format", "form", type=click.Choice(["sessions", "mooncake"]), default=None, help="With --anonymize: a session file, or Mooncake rows as AIPerf reads them [default: sessions].")
def capture(
    listen: str, upstream: str, out: str, session_header: str, redact: bool, idle_timeout: str, tenant: str,
    anonymize: bool, block_size: int | None, form: str | None,
) -> None:  # fmt: skip
    """Forward OpenAI-compatible traffic to --upstream unchanged and record it as a replayable session file."""
    from loadgen.capture import CaptureOptions, run_capture
    from loadgen.capture.anonymized import ANONYMIZE_BLOCK_SIZE_ENV, ANONYMIZE_FORMAT_ENV, DEFAULT_BLOCK_SIZE

    if block_size is not None and not anonymize:
        raise UserError("--block-size only applies with --anonymize; add --anonymize or drop --block-size")
    if form is not None and not anonymize:
        raise UserError("--anonymize-format only applies with --anonymize; add --anonymize or drop --anonymize-format")
    if anonymize and redact:
        raise UserError("--anonymize writes no text at all, so --redact adds nothing; give one of them")
    opts = CaptureOptions(
        listen=listen, upstream=upstream, out=out, session_header=session_header, redact=redact,
        idle_timeout_s=parse_duration_s(idle_timeout), tenant=tenant,
    )  # fmt: skip
    if not anonymize:
        sys.exit(run_capture(opts))
    os.environ[ANONYMIZE_BLOCK_SIZE_ENV] = str(block_size or DEFAULT_BLOCK_SIZE)  # for the assembler process
    os.environ[ANONYMIZE_FORMAT_ENV] = form or "sessions"
    try:
        code = run_capture(opts)
    finally:  # nothing else of this process (a test runner calling the command) is anonymised
        os.environ.pop(ANONYMIZE_BLOCK_SIZE_ENV, None)
        os.environ.pop(ANONYMIZE_FORMAT_ENV, None)
    sys.exit(code)


class _LazyGroup(click.Group):
    """A group whose commands live in other packages, imported only when one of them is run (or
    listed): the simulated engine alone costs every other command ~0.3 s of imports. A package
    that is not installed simply has no command here."""

    def __init__(self, *args: Any, lazy: dict[str, tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lazy = lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        names = set(super().list_commands(ctx))
        names.update(n for n in self._lazy if self.get_command(ctx, n) is not None)
        return sorted(names)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self._lazy:
            module, attr = self._lazy[cmd_name]
            try:
                mod = __import__(module, fromlist=[attr])
            except ImportError:
                return None
            cmd = getattr(mod, attr, None)
            if cmd is None:
                return None
            self.add_command(cmd, cmd_name)
        return super().get_command(ctx, cmd_name)


@main.group(
    cls=_LazyGroup,
    lazy={
        "sim": ("targets.sim.cli", "sim_command"),
        "fleet": ("targets.fleet.cli", "fleet_command"),
        "llama-server": ("targets.llamacpp.cli", "llama_server_command"),
    },
)
def serve() -> None:
    """Start local targets: a simulated engine, a fleet behind a router, llama-server."""


@main.group()
def workload() -> None:
    """Inspect, analyze, export and anonymize workloads."""


def _workload_file_options(f: Callable) -> Callable:
    """The options ``workload inspect`` and ``workload export`` share with ``run``."""
    opts = [
        click.option("--workload-format", "--format", "fmt", default=None, help="Data file format: sessions, sharegpt, mooncake, azure, burstgpt, bailian, weka-trace (default: detected); --format is the same."),
        click.option("--workload-options", default=None, help="Reader options, e.g. min_turns=2 or block_size=512."),
        click.option("--seed", type=int, default=0, show_default=True),
        click.option("--tokenizer", default=None, help="Count and build texts with this tokenizer (tokenizer.json, directory, cached ORG/NAME)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _load_for_command(name: str, fmt: str | None, workload_options: str | None, tokenizer: str | None) -> Any:
    from loadgen.runtime.run_workload import load_workload_named, parse_options_flag

    return load_workload_named(name, fmt, parse_options_flag(workload_options or ""), tokenizer)


@workload.command("inspect")
@click.argument("name")
@_workload_file_options
@click.option("-n", "--num-sessions", type=click.IntRange(min=1), default=None, help="Sessions to look at (default: all of a file, 100 of a spec).")
@click.option("--block-size", type=click.IntRange(min=1), default=None, help="KV block of the prefix-reuse figures, tokens (default: the trace's, else 16).")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def workload_inspect(
    name: str, fmt: str | None, workload_options: str | None, seed: int, tokenizer: str | None, num_sessions: int | None,
    block_size: int | None, as_json: bool,
) -> None:  # fmt: skip
    """Sessions, turns, token distributions, arrival span and prefix reuse of a spec or data file; sends nothing."""
    from loadgen.commands.workload import inspect_command

    inspect_command(name, fmt, workload_options, seed, tokenizer, num_sessions, block_size, as_json)


@workload.command("analyze")
@click.argument("name")
@_workload_file_options
@click.option("-n", "--num-sessions", type=click.IntRange(min=1), default=None, help="Sessions to look at (default: all of a file, 100 of a spec).")
@click.option("--block-size", type=click.IntRange(min=1), default=None, help="KV block, tokens (default: the trace's, else 16).")
@click.option("--capacity", "capacities", type=click.IntRange(min=1), multiple=True, metavar="TOKENS", help="KV capacity to give the hit rate at (repeat; default: 64k tokens and up by 4x to the working set).")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def workload_analyze(
    name: str, fmt: str | None, workload_options: str | None, seed: int, tokenizer: str | None, num_sessions: int | None,
    block_size: int | None, capacities: tuple[int, ...], as_json: bool,
) -> None:  # fmt: skip
    """Prefix reuse, the cache-hit rate as a function of KV capacity, and session shapes; sends nothing."""
    from loadgen.commands.workload import analyze_command

    analyze_command(name, fmt, workload_options, seed, tokenizer, num_sessions, block_size, capacities, as_json)


@workload.command("anonymize")
@click.argument("name")
@_workload_file_options
@click.option("-n", "--num-sessions", type=click.IntRange(min=1), default=None, help="Sessions to write (default: all of a file, 100 of a spec).")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False))
@click.option("--block-size", type=click.IntRange(min=1), default=512, show_default=True, help="Tokens per block id (Mooncake's 512; the engine's, e.g. 16, keeps shared prefixes to the token).")
@click.option("--anonymize-format", "form", type=click.Choice(["sessions", "mooncake"]), default="sessions", show_default=True, help="Write a session file, or Mooncake rows (session_id, timestamp, delay, hash_ids) as AIPerf reads them.")
def workload_anonymize(
    name: str, fmt: str | None, workload_options: str | None, seed: int, tokenizer: str | None, num_sessions: int | None,
    output: str, block_size: int, form: str,
) -> None:  # fmt: skip
    """Write NAME's sessions with no text: prefix-chained, salted block hashes, sizes, timings and structure."""
    from loadgen.commands.workload import anonymize_command

    anonymize_command(name, fmt, workload_options, seed, tokenizer, num_sessions, block_size, output, form)


@workload.command("export")
@click.argument("name")
@_workload_file_options
@click.option("-n", "--num-sessions", type=click.IntRange(min=1), default=None, help="Sessions to write (default: all of a file, 100 of a spec).")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False))
@click.option("--counts-only", is_flag=True, help="Write token counts instead of texts (replays the same texts for the same seed).")
def workload_export(
    name: str,
    fmt: str | None,
    workload_options: str | None,
    seed: int,
    tokenizer: str | None,
    num_sessions: int | None,
    output: str,
    counts_only: bool,
) -> None:
    """Write NAME's sessions (spec, dataset or trace) in the replayable JSONL session format."""
    from workloads.errors import WorkloadError
    from workloads.sessions_jsonl import write_sessions_jsonl

    wl = _load_for_command(name, fmt, workload_options, tokenizer)
    n = num_sessions or wl.num_sessions or 100
    try:
        write_sessions_jsonl(wl, seed, n, output, include_text=not counts_only)
    except WorkloadError as e:
        raise UserError(str(e)) from None
    click.echo(f"wrote {n} sessions to {output}")



if __name__ == "__main__":
    main()
