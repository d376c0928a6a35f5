"""``loadgen sweep``: runs at several arrival rates, and the largest rate that holds the SLOs.

Each point is a complete ``loadgen run`` (``loadgen.commands.run.run``) with its own fresh embedded fleet
(or the given ``--target``) and its own results directory, ``<results>/<sweep-id>/rate-<r>/``; the
search itself is ``analysis.grid`` (``--rates``) or ``analysis.find_max_rate`` (``--search``, a
bisection). ``sweep.json`` is rewritten after every point (status ``running``), so a sweep that dies
keeps what it measured; at the end it holds the answer, and ``sweep.html`` plots latency
percentiles and goodput against rate.

Goodput counts requests that meet per-request SLOs. When ``--slo`` gives only percentile SLOs, the
limits of the TTFT, TPOT and E2E ones also apply per request (``ttft_p99=500ms`` adds ``ttft=500ms``),
so that goodput means "requests as good as the SLO asks" at every rate.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import click
import orjson

from loadgen.commands.run import RunOptions, run, validate
from loadgen.errors import UserError
from loadgen.runtime.locust_options import new_run_id
from loadgen.runtime.verdict import EXIT_INCOMPLETE

SWEEP_SCHEMA_VERSION = 1
SWEEP_FILE = "sweep.json"
SWEEP_REPORT_FILE = "sweep.html"
_PER_REQUEST_FROM_PERCENTILE = ("ttft", "tpot", "e2e")


@dataclass(frozen=True)
class SweepPlan:
    """What to run: a grid of ``rates``, or a bisection between ``min_rate`` and ``max_rate``."""

    slo: str
    rates: tuple[float, ...] = ()
    min_rate: float | None = None
    max_rate: float | None = None
    steps: int = 6
    max_error_rate: float = 0.01

    @property
    def method(self) -> str:
        return "grid" if self.rates else "bisect"


class _Stopped(Exception):
    """A point did not complete (interrupted or crashed): the sweep cannot judge it."""


def parse_rates(text: str) -> tuple[float, ...]:
    """``1,2,4,8`` (any rate form: ``30/min``) -> ascending distinct rates per second."""
    from analysis.units import RATE_FORM, parse_rate_per_s

    rates = []
    for item in (i.strip() for i in text.split(",") if i.strip()):
        try:
            rates.append(parse_rate_per_s(item))
        except ValueError:
            raise UserError(
                f"--rates: {item!r} is not a rate; use {RATE_FORM}, comma-separated (1,2,4,8)"
            ) from None
    if not rates:
        raise UserError("--rates is empty; use e.g. 1,2,4,8")
    return tuple(sorted(set(rates)))


def with_goodput_slos(slo: str) -> str:
    """``slo`` plus per-request SLOs from its TTFT/TPOT/E2E percentile limits, unless it has its own."""
    from analysis.slo import RequestSlo, parse_slos

    slos = parse_slos(slo)
    if slos.per_request:
        return slo
    extra = []
    for metric in _PER_REQUEST_FROM_PERCENTILE:
        limits = [s.limit_us for s in slos.percentile if s.metric == metric]
        if limits:
            extra.append(str(RequestSlo(metric, min(limits))))
    return ",".join([str(slos), *extra])


def plan_from_flags(
    *,
    slo: str | None,
    rates: str | None,
    search: bool,
    min_rate: str | None,
    max_rate: str | None,
    steps: int,
    max_error_rate: str,
    rate_given: bool,
    concurrency: int,
) -> SweepPlan:
    """Check the sweep's own flags (before any process starts) and return the plan."""
    from analysis.slo import parse_slos
    from analysis.units import parse_rate_per_s
    from loadgen.commands.compare import parse_fraction

    if rate_given:
        raise UserError("sweep sets the rate of each run; drop --rate and give --rates 1,2,4 or --search")
    if concurrency:
        raise UserError("sweep varies the arrival rate of an open loop; drop --concurrency")
    if bool(rates) == search:
        raise UserError(
            "give either --rates 1,2,4,8 (a grid) or --search --min-rate R --max-rate R (a bisection)"
        )
    if not slo:
        raise UserError(
            "sweep needs --slo with at least one percentile SLO, e.g. --slo ttft_p99=500ms,itl_p99=50ms"
        )
    try:
        slos = parse_slos(slo)
    except ValueError as e:
        raise UserError(f"--slo: {e}") from None
    if not slos.percentile:
        raise UserError(
            "sweep needs a percentile SLO in --slo (e.g. ttft_p99=500ms); per-request ones only set goodput"
        )
    errors = parse_fraction("--max-error-rate", max_error_rate)
    if rates:
        return SweepPlan(slo=slo, rates=parse_rates(rates), max_error_rate=errors)
    if min_rate is None or max_rate is None:
        raise UserError("--search needs --min-rate and --max-rate, e.g. --min-rate 1 --max-rate 64")
    lo, hi = parse_rate_per_s(min_rate), parse_rate_per_s(max_rate)
    if lo >= hi:
        raise UserError(f"--min-rate {min_rate} must be below --max-rate {max_rate}")
    return SweepPlan(slo=slo, min_rate=lo, max_rate=hi, steps=steps, max_error_rate=errors)


def run_sweep(base: RunOptions, plan: SweepPlan) -> tuple[Any, Path]:
    """Run the plan; returns (``analysis.SweepResult``, sweep directory). Raises ``_Stopped``."""
    from analysis.slo import parse_slos
    from analysis.summary import summarize
    from analysis.sweep import find_max_rate, grid, judge_point, key_figures

    validate(base)
    sweep_id = base.run_id or new_run_id(f"sweep-{Path(base.workload).stem}")
    sweep_dir = Path(base.results) / sweep_id
    if sweep_dir.exists() and any(sweep_dir.iterdir()):
        raise UserError(f"{sweep_dir} already holds results; give another --run-id")
    sweep_dir.mkdir(parents=True, exist_ok=True)
    slo = with_goodput_slos(plan.slo)
    slo_set = parse_slos(plan.slo)
    done: list[dict[str, Any]] = []
    header = {"schema_version": SWEEP_SCHEMA_VERSION, "sweep_id": sweep_id, "method": plan.method,
              "plan": asdict(plan), "slo_applied": slo, "options": _options(base)}  # fmt: skip

    def evaluate(rate: float) -> dict[str, Any]:
        opts = replace(base, rate=f"{rate:.6g}", run_id=f"rate-{rate:.6g}", results=str(sweep_dir), slo=slo)
        run_dir = sweep_dir / opts.run_id
        print(f"\n== sweep {sweep_id}: point {len(done) + 1} at {rate:g}/s ==", file=sys.stderr, flush=True)
        code = run(opts)
        if not (run_dir / "run.json").exists():
            raise _Stopped(f"the run at {rate:g}/s wrote no results (exit {code}); see its output above")
        try:
            summary = summarize(run_dir, slos=slo)
        except ValueError as e:
            raise _Stopped(f"the run at {rate:g}/s cannot be read: {e}") from None
        # A partial run (or exit 5) is judged incomplete, exit 4 the generator's: analysis.sweep.judge_point.
        summary["exit_code"] = code
        outcome, _ = judge_point(summary, slo_set, max_error_rate=plan.max_error_rate)
        done.append({"rate_per_s": rate, "exit_code": code, "outcome": outcome, **key_figures(summary)})
        _write_json(sweep_dir / SWEEP_FILE, {**header, "status": "running", "points": done})
        if summary.get("status") == "aborted":
            # Stopped before its end: most often the user's Ctrl-C (or a lost worker under
            # --on-worker-loss abort, a full disk), which would stop every later point too.
            raise _Stopped(
                f"the run at {rate:g}/s was stopped before its end ({summary.get('partial_reason')}): "
                "neither pass nor fail"
            )
        return summary

    try:
        if plan.rates:
            result = grid(evaluate, plan.slo, plan.rates, max_error_rate=plan.max_error_rate)
        else:
            result = find_max_rate(evaluate, plan.slo, plan.min_rate, plan.max_rate, steps=plan.steps,
                                   max_error_rate=plan.max_error_rate)  # fmt: skip
    except _Stopped as e:
        _write_json(
            sweep_dir / SWEEP_FILE, {**header, "status": "stopped", "stop_reason": str(e), "points": done}
        )
        raise
    _write_json(sweep_dir / SWEEP_FILE, {**header, "status": "complete", **result.to_dict()})
    return result, sweep_dir


def write_sweep_report(result: Any, sweep_dir: Path) -> Path:
    from analysis.report import render_sweep_report

    path = sweep_dir / SWEEP_REPORT_FILE
    path.write_text(render_sweep_report(result), encoding="utf-8")
    return path


def run_sweep_command(flags: dict[str, Any], *, rate_given: bool) -> int:
    """The click front's call: flags in, exit code out: 0 the server's max rate found (or the SLOs hold
    at the top of the range); 3 the server missed at every rate; 4 the generator was the limit
    (inconclusive above the answer: add workers); 5 a point did not complete (neither pass nor fail)."""
    from analysis.sweep import format_sweep

    sweep_keys = ("rates", "search", "min_rate", "max_rate", "steps", "max_error_rate")
    own = {k: flags.pop(k) for k in sweep_keys}
    plan = plan_from_flags(
        slo=flags.get("slo"), rate_given=rate_given, concurrency=flags.get("concurrency", 0), **own
    )
    base = RunOptions(**flags)
    try:
        result, sweep_dir = run_sweep(base, plan)
    except _Stopped as e:
        click.echo(f"loadgen sweep: stopped: {e}; the points so far are in {Path(base.results)}", err=True)
        return EXIT_INCOMPLETE
    report = write_sweep_report(result, sweep_dir)
    click.echo("")
    click.echo(format_sweep(result))
    click.echo(f"sweep: {sweep_dir / SWEEP_FILE}, {report}")
    return result.exit_code


def _options(opts: RunOptions) -> dict[str, Any]:
    keep = ("workload", "workload_format", "workload_options", "seed", "arrival", "burstiness", "num_sessions", "duration", "warmup", "target",
            "adapter", "model", "profile", "time_scale", "replicas", "router", "engine", "workers", "cost_per_hour")  # fmt: skip
    return {k: getattr(opts, k) for k in keep}


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2))
    tmp.replace(path)


__all__ = [
    "SweepPlan",
    "parse_rates",
    "plan_from_flags",
    "run_sweep",
    "run_sweep_command",
    "with_goodput_slos",
]
