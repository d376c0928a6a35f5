"""``loadgen compare`` and ``loadgen gate``: two results directories in, a verdict out.

Both read only the files of finished (or partial) runs, through ``analysis``; every problem a user
can fix (a missing or damaged file, runs that are not comparable, a bad flag value) is one
``UserError`` line and exit code 2. ``gate`` exits 3 when a check fails, like a missed SLO in a run.
"""

from __future__ import annotations

from pathlib import Path

import click

from loadgen.errors import UserError
from loadgen.runtime.verdict import EXIT_OK, EXIT_SLO_MISSED

COMPARE_STATS = ("p50", "p90", "p95", "p99", "mean")


def parse_fraction(flag: str, text: str) -> float:
    """``5%`` or ``0.05`` -> 0.05; a one-line UserError naming ``flag`` otherwise."""
    t = text.strip()
    try:
        value = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        raise UserError(f"{flag}: {text!r} is not a fraction; use e.g. 5% or 0.05") from None
    if value < 0:
        raise UserError(f"{flag}: {text!r} must be >= 0")
    return value


def parse_max_regression(text: str) -> dict[str, str]:
    """``ttft_p99=10%,itl_p95@follow-up=5%`` -> ``{"ttft_p99": "10%", ...}`` (checked by analysis.gate)."""
    from analysis.gate import KEY_FORM
    from analysis.gate import parse_max_regression as check

    out: dict[str, str] = {}
    for item in (i.strip() for i in text.split(",") if i.strip()):
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise UserError(
                f"--max-regression: {item!r} is not KEY=TOLERANCE; KEY is {KEY_FORM}; TOLERANCE e.g. 10%"
            )
        out[key.strip()] = value.strip()
    if not out:
        raise UserError("--max-regression is empty; use e.g. ttft_p99=10%,itl_p99=5%")
    try:
        check(out)
    except ValueError as e:
        raise UserError(f"--max-regression: {str(e).removeprefix('max_regression ')}") from None
    return out


def _metric_at(text: str) -> tuple[str, str]:
    """``ttft@follow-up`` -> ("ttft", "follow-up"); the turn class defaults to all turns."""
    from analysis.compare import METRICS, TURN_CLASSES

    metric, _, tc = text.partition("@")
    tc = tc or "all"
    if metric not in METRICS or tc not in TURN_CLASSES:
        raise UserError(
            f"--svg-metric: {text!r} is not METRIC[@TURNS]; metrics {', '.join(METRICS)}; "
            f"turns {', '.join(TURN_CLASSES)}"
        )
    return metric, tc


def compare(
    a: str,
    b: str,
    *,
    force: bool = False,
    md: bool = False,
    as_json: bool = False,
    svg: str | None = None,
    svg_metric: str = "ttft",
    html: str | None = None,
    stat: str = "p95",
    min_effect: str = "5%",
    n_boot: int = 2000,
) -> int:
    """Compare run B against baseline A; print a table (or Markdown, or JSON); write the plots asked for."""
    from analysis.compare import compare_runs
    from analysis.compare_format import compare_cdf_svg, compare_to_json, compare_to_markdown, format_compare

    if md and as_json:
        raise UserError("give one of --md and --json (each replaces the table on stdout)")
    metric, tc = _metric_at(svg_metric)
    effect = parse_fraction("--min-effect", min_effect)
    if stat not in COMPARE_STATS:
        raise UserError(f"--stat {stat}: use one of {', '.join(COMPARE_STATS)}")
    # A bad or missing file, or runs that are not comparable, is a ResultsError (said in one line
    # by the CLI); the arguments are checked above, so any other error is a bug.
    cmp = compare_runs(a, b, force=force, n_boot=n_boot, min_effect=effect, headline_stat=stat)
    if as_json:
        click.echo(compare_to_json(cmp))
    elif md:
        click.echo(compare_to_markdown(cmp), nl=False)
    else:
        click.echo(format_compare(cmp))
    written = []
    if svg:
        _write(svg, compare_cdf_svg(cmp, metric, tc))
        written.append(f"svg: {svg}")
    if html:
        from analysis.report import render_compare_report

        _write(html, render_compare_report(cmp))
        written.append(f"report: {html}")
    for line in written:  # on stderr when stdout carries Markdown or JSON for a machine
        click.echo(line, err=md or as_json)
    return EXIT_OK


def gate(
    run: str,
    *,
    baseline: str | None = None,
    max_regression: str | None = None,
    slo: str | None = None,
    min_attainment: str | None = None,
    max_error_rate: str | None = None,
    force: bool = False,
    n_boot: int = 2000,
) -> int:
    """Judge RUN for CI: print every check, then one verdict line; 0 pass, 3 fail."""
    from analysis.gate import gate as judge
    from analysis.slo import parse_slos

    tolerances = parse_max_regression(max_regression) if max_regression else None
    if tolerances and not baseline:
        raise UserError("--max-regression needs --baseline DIR (the run to compare against)")
    if slo:
        try:
            parse_slos(slo)
        except ValueError as e:
            raise UserError(f"--slo: {e}") from None
    attainment = None if min_attainment is None else parse_fraction("--min-attainment", min_attainment)
    error_rate = None if max_error_rate is None else parse_fraction("--max-error-rate", max_error_rate)
    # The arguments are checked above; a bad results directory is a ResultsError (one line).
    result = judge(
        run,
        baseline,
        tolerances,
        slo,
        min_attainment=attainment,
        max_error_rate=error_rate,
        force=force,
        n_boot=n_boot,
    )
    if result.comparison is not None:
        for name in ("a", "b"):
            arm = result.comparison[name]
            role = "baseline" if name == "a" else "run"
            click.echo(f"{role}: {arm['run_id']} ({arm['dir']}), {arm['requests']:,} requests")
        click.echo(result.comparison["pairing"])
    for line in result.checks:
        click.echo(line)
    if result.ok:
        click.echo(f"loadgen gate: PASS: {len(result.checks)} checks")
        return EXIT_OK
    click.echo(
        f"loadgen gate: FAIL (exit {EXIT_SLO_MISSED}): {len(result.reasons)} of {len(result.checks)} checks failed"
    )
    return EXIT_SLO_MISSED


def _write(path: str, text: str) -> None:
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
    except OSError as e:
        raise UserError(f"{p}: cannot write ({e.strerror})") from None
