"""``loadgen workload analyze``: what a workload asks of a prefix cache, and its sessions' shape.

The theoretical cache-hit rate as a function of KV capacity (an LRU over the block-hash sequence
in arrival order, :mod:`workloads.reuse`; the computation ``inspect`` uses), then session shape
statistics: turns per session, whole-prompt and output lengths, think times, fan-out widths.
Works on every format loadgen reads; sizes are counted as ``inspect`` counts them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from workloads.figures import collect, dist, reuse_figures
from workloads.inspect import DEFAULT_SYNTHETIC_SESSIONS, arrival_figures, describe
from workloads.text import BUILTIN, TextTokenizer
from workloads.workload import Workload


def analyze_workload(
    workload: Workload,
    *,
    seed: int = 0,
    n: int | None = None,
    tokenizer: TextTokenizer = BUILTIN,
    block_size: int | None = None,
    capacities_tokens: list[int] | None = None,
    progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Reuse and shape figures of sessions ``0..n-1`` (all of a file, 100 of a spec), JSON-ready.

    ``capacities_tokens``: the KV capacities to give the hit rate at (default: 64k tokens and up
    by factors of 4 to the working set).
    """
    if n is None and getattr(workload, "rows", None) is None and workload.num_sessions is None:
        n = DEFAULT_SYNTHETIC_SESSIONS
    shapes, curve, offsets = collect(
        workload, seed=seed, n=n, tokenizer=tokenizer, block_size=block_size, progress=progress
    )
    out: dict[str, Any] = {
        "workload": describe(workload),
        "seed": seed,
        "sessions": len(shapes.turns_per),
        "requests": len(shapes.prompts),
        "prefix_cache": reuse_figures(curve, capacities_tokens),
        "turns_per_session": dist(shapes.turns_per),
        "prompt_tokens": dist(shapes.prompts),
        "new_tokens_per_turn": dist(shapes.first_in + shapes.follow_in),
        "output_tokens": dist(shapes.outputs),
        "think_time_s": dist(shapes.thinks),
        "fan_out_children": dist(shapes.fan_out),
        "step_kinds": shapes.kinds,
        "tokenizer": tokenizer.describe(),
    }
    if offsets is not None:
        out["arrivals"] = arrival_figures(offsets)
    return out


def format_analysis(fig: dict[str, Any]) -> str:
    """The report ``loadgen workload analyze`` prints."""
    wl = fig["workload"]
    pc = fig["prefix_cache"]
    B = pc["block_size"]
    lines = [
        f"{wl['source']}: {wl['kind']} workload {wl['name']!r}, {fig['sessions']:,} sessions, {fig['requests']:,} requests",
        "",
        f"prefix cache (blocks of {B} tokens; an LRU over the requests' block hashes in arrival order)",
        f"  prefix reuse        {pc['reuse']:.1%} of {pc['prompt_tokens']:,} prompt tokens (an unbounded cache)",
    ]
    if pc["reused_tokens"]:
        need = pc["capacity_tokens_for"]
        lines.append(
            "  KV for the reuse    "
            + ", ".join(f"{share} at {tokens:,} tokens" for share, tokens in need.items())
            + f", all at {pc['working_set_tokens']:,}"
        )
    lines.append(f"  {'KV capacity':>18}  {'hit rate':>8}  {'of the reuse':>12}")
    for row in pc["hit_rate_at"]:
        lines.append(f"  {row['capacity_tokens']:>18,}  {row['hit_rate']:>8.1%}  {row['share_of_reuse']:>12.1%}")
    lines += ["", "sessions"]
    rows = [
        ("turns per session", fig["turns_per_session"], "{:,.0f}", ""),
        ("prompt tokens", fig["prompt_tokens"], "{:,.0f}", " (whole prompt; replies as long as asked)"),
        ("new tokens per turn", fig["new_tokens_per_turn"], "{:,.0f}", ""),
        ("output max_tokens", fig["output_tokens"], "{:,.0f}", ""),
        ("think time (s)", fig["think_time_s"], "{:.3g}", ""),
        ("fan-out children", fig["fan_out_children"], "{:,.0f}", ""),
    ]
    for label, d, fmt, note in rows:
        if d is not None:
            cells = "  ".join(f"{k} {fmt.format(d[k])}" for k in ("p50", "p90", "p99", "max"))
            lines.append(f"  {label:<20}{cells}{note}")
    if len(fig["step_kinds"]) > 1:
        lines.append(f"  {'step kinds':<20}" + ", ".join(f"{k} {v:,}" for k, v in fig["step_kinds"].items()))
    arr = fig.get("arrivals")
    if arr is not None:
        rate = "-" if arr["rate_per_s"] is None else f"{arr['rate_per_s']:.3g} sessions/s"
        lines.append(f"  {'arrivals':<20}span {arr['span_s']:.1f} s, {rate}")
    return "\n".join(lines)
