"""``loadgen workload inspect | analyze | anonymize``: load the workload, run one pass, print.

A large trace is read as a stream (``workloads.streamed``), as a run reads it; on a terminal, or
for a file of 8 MiB or more, a progress line goes to stderr about once a second.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from loadgen.runtime.run_workload import load_workload_named, parse_options_flag
from workloads.progress import ReadProgress
from workloads.streamed import STREAM_MIN_BYTES


def _load(name: str, fmt: str | None, workload_options: str | None, tokenizer: str | None) -> Any:
    return load_workload_named(name, fmt, parse_options_flag(workload_options or ""), tokenizer, stream=True)


def _progress(name: str, what: str) -> ReadProgress | None:
    try:
        large = Path(name).stat().st_size >= STREAM_MIN_BYTES
    except OSError:
        large = False
    return ReadProgress(sys.stderr, f"{what} {name}") if large or sys.stderr.isatty() else None


def _one_pass(name: str, what: str, work: Callable[[ReadProgress | None], Any]) -> Any:
    """``work(progress)``: one pass over the workload, with its progress line (a bad row's
    ``WorkloadError`` names it)."""
    progress = _progress(name, what)
    try:
        return work(progress)
    finally:
        if progress is not None:
            progress.done()


def inspect_command(
    name: str, fmt: str | None, workload_options: str | None, seed: int, tokenizer: str | None,
    num_sessions: int | None, block_size: int | None, as_json: bool,
) -> None:  # fmt: skip
    from workloads.inspect import format_inspection, inspect_workload

    wl = _load(name, fmt, workload_options, tokenizer)
    fig = _one_pass(
        name, "inspect",
        lambda progress: inspect_workload(
            wl, seed=seed, n=num_sessions, tokenizer=wl.tokenizer, block_size=block_size, progress=progress
        ),
    )  # fmt: skip
    click.echo(json.dumps(fig, indent=2) if as_json else format_inspection(fig))


def analyze_command(
    name: str, fmt: str | None, workload_options: str | None, seed: int, tokenizer: str | None,
    num_sessions: int | None, block_size: int | None, capacities: tuple[int, ...], as_json: bool,
) -> None:  # fmt: skip
    from workloads.analyze import analyze_workload, format_analysis

    wl = _load(name, fmt, workload_options, tokenizer)
    fig = _one_pass(
        name, "analyze",
        lambda progress: analyze_workload(
            wl, seed=seed, n=num_sessions, tokenizer=wl.tokenizer, block_size=block_size,
            capacities_tokens=sorted(capacities) or None, progress=progress,
        ),
    )  # fmt: skip
    click.echo(json.dumps(fig, indent=2) if as_json else format_analysis(fig))


def anonymize_command(
    name: str, fmt: str | None, workload_options: str | None, seed: int, tokenizer: str | None,
    num_sessions: int | None, block_size: int, output: str, form: str = "sessions",
) -> None:  # fmt: skip
    from workloads.anonymize import FORMAT_MOONCAKE, AnonymizeCounts, write_anonymized

    wl = _load(name, fmt, workload_options, tokenizer)
    if num_sessions is None and getattr(wl, "rows", None) is None and wl.num_sessions is None:
        num_sessions = 100  # a spec: as many as export writes
    counts = AnonymizeCounts()
    n = _one_pass(
        name, "anonymize",
        lambda progress: write_anonymized(
            wl, seed, num_sessions, output, block_size=block_size, progress=progress, form=form, counts=counts
        ),
    )  # fmt: skip
    what = "anonymised sessions" if form != FORMAT_MOONCAKE else "anonymised sessions as Mooncake rows"
    click.echo(f"wrote {n} {what} to {output} (blocks of {block_size} tokens, a fresh salt)")
    if counts.flattened:
        click.echo(f"{counts.flattened} of them have sub-agents (fan-out), written flattened: their steps' rows in plan order as one conversation")
