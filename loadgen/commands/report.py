"""``loadgen report``: summarise a results directory, complete or partial, from its files alone."""

from __future__ import annotations

from pathlib import Path

import click

from loadgen.errors import UserError


def report_run(
    run_dir: str | Path,
    *,
    html: bool = False,
    csv_path: str | None = None,
    slo: str | None = None,
    cost_per_hour: float | None = None,
) -> dict:
    import orjson

    from analysis.slo import parse_slos
    from analysis.summary import format_summary, summary_to_csv, write_summary

    try:
        slos = parse_slos(slo) if slo else None
    except ValueError as e:
        raise UserError(f"--slo: {e}") from None
    # A bad or missing file is a ResultsError, which the CLI says in one line; any other error
    # here is a bug and is not dressed up as a usage error.
    summary = orjson.loads(write_summary(run_dir, slos=slos, cost_per_hour_usd=cost_per_hour).read_bytes())
    click.echo(format_summary(summary))
    if csv_path:
        Path(csv_path).write_text(summary_to_csv(summary))
        click.echo(f"csv: {csv_path}")
    if html:
        from analysis.report import write_report

        click.echo(f"report: {write_report(run_dir)}")
    return summary
