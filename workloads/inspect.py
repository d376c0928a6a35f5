"""``loadgen workload inspect``: what a workload holds, before any load is sent.

Sessions and turns, token distributions (new tokens per turn, output ``max_tokens``, and the
context the last turn sends when every earlier reply is as long as asked), think times, the
arrival span of a file with timestamps, the reader's own figures (drops, failed rows), and the
prefix reuse of the sessions it covers with the LRU cache size that realises it
(:mod:`workloads.figures`). Every figure covers the same sessions ``0..n-1``; counts come from
the file's token counts, so no prompt text is built where the format gives counts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from workloads.figures import collect, dist, reuse_figures
from workloads.text import BUILTIN, TextTokenizer
from workloads.workload import Workload

DEFAULT_SYNTHETIC_SESSIONS = 100
# The reader's whole-file reuse figures; inspect prints its own, over the sessions it covers.
_WHOLE_FILE_STATS = ("prefix_reuse", "unique_blocks")


def inspect_workload(
    workload: Workload,
    *,
    seed: int = 0,
    n: int | None = None,
    tokenizer: TextTokenizer = BUILTIN,
    block_size: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Figures of sessions ``0..n-1`` (all of a file; ``DEFAULT_SYNTHETIC_SESSIONS`` of a spec).

    ``block_size``: the KV block of the reuse figures (default: the trace's, else 16 tokens).
    ``progress(k)`` is called as sessions are read.
    """
    if n is None and getattr(workload, "rows", None) is None and workload.num_sessions is None:
        n = DEFAULT_SYNTHETIC_SESSIONS
    shapes, curve, offsets = collect(
        workload, seed=seed, n=n, tokenizer=tokenizer, block_size=block_size, progress=progress
    )
    covered = len(shapes.turns_per)
    streamed = is_streamed(workload)
    out: dict[str, Any] = {
        "workload": describe(workload),
        "seed": seed,
        "sessions": covered,
        # A file read as a stream is counted only when read to its end.
        "sessions_in_source": (covered if n is None or covered < n else None) if streamed else workload.num_sessions,
        "streamed": streamed,
        "turns": int(sum(shapes.turns_per)),
        "tenants": shapes.tenants,
        "roles": shapes.roles,
        "turns_per_session": dist(shapes.turns_per),
        "first_turn_tokens": dist(shapes.first_in),
        "follow_up_tokens": dist(shapes.follow_in),
        "output_tokens": dist(shapes.outputs),
        "last_turn_context_tokens": dist(shapes.context),
        "think_time_s": dist(shapes.thinks),
        "prefix_cache": reuse_figures(curve),
        "tokenizer": tokenizer.describe(),
    }
    if offsets is not None:
        out["arrivals"] = arrival_figures(offsets)
    stats = {k: v for k, v in (getattr(workload, "stats", None) or {}).items() if k not in _WHOLE_FILE_STATS}
    if stats:
        out["reader"] = stats
    return out


def is_streamed(workload: Workload) -> bool:
    """A trace read row by row (``workloads.streamed``): one pass per question asked of it."""
    return getattr(workload, "rows", None) is not None and getattr(workload, "record", None) is None


def describe(workload: Workload) -> dict[str, Any]:
    """What the workload is, without its fingerprint: hashing every record of a 10M-row file
    costs more than inspecting it, and inspect records no run."""
    out: dict[str, Any] = {"kind": workload.kind, "name": workload.name, "source": workload.source}
    if not is_streamed(workload):  # a stream is counted only by reading it whole
        out["num_sessions"] = workload.num_sessions
    options = getattr(workload, "options", None)
    if options:
        out["options"] = dict(options)
    return out


def arrival_figures(offsets: np.ndarray) -> dict[str, Any]:
    """Span, mean rate and burstiness (CV of the gaps) of sorted arrival offsets."""
    span = float(offsets[-1] - offsets[0]) if len(offsets) else 0.0
    gaps = np.diff(offsets)
    mean_gap = float(gaps.mean()) if len(gaps) else 0.0
    return {
        "count": len(offsets),
        "span_s": span,
        "rate_per_s": (len(offsets) - 1) / span if span > 0 else None,
        "gap_cv": float(gaps.std() / mean_gap) if mean_gap > 0 else None,
        "max_gap_s": float(gaps.max()) if len(gaps) else None,
    }


def format_inspection(fig: dict[str, Any]) -> str:
    """The report ``loadgen workload inspect`` prints."""
    wl = fig["workload"]
    held = fig["sessions_in_source"]
    scope = f"{fig['sessions']:,} sessions" + ("" if held is None else f" of {held:,}")
    if fig.get("streamed") and held is None:
        scope += " (the first of a file read as a stream)"
    elif held is None:
        scope += f" (generated for seed {fig['seed']})"
    lines = [f"{wl['source']}: {wl['kind']} workload {wl['name']!r}, {scope}, {fig['turns']:,} turns"]
    if len(fig["tenants"]) > 1:
        lines.append("tenants             " + ", ".join(f"{k} {v}" for k, v in fig["tenants"].items()))
    if len(fig["roles"]) > 1:
        lines.append("turn roles          " + ", ".join(f"{k} {v}" for k, v in fig["roles"].items()))
    rows = [
        ("turns per session", fig["turns_per_session"], ""),
        ("first-turn tokens", fig["first_turn_tokens"], ""),
        ("follow-up tokens", fig["follow_up_tokens"], ""),
        ("output max_tokens", fig["output_tokens"], ""),
        ("last-turn context", fig["last_turn_context_tokens"], " (replies as long as asked)"),
    ]
    for label, d, note in rows:
        if d is not None:
            lines.append(f"{label:<20}{_dist_line(d)}{note}")
    if fig["think_time_s"] is not None:
        d = fig["think_time_s"]
        lines.append(f"{'think time':<20}p50 {d['p50']:.3g} s  p90 {d['p90']:.3g} s  max {d['max']:.3g} s")
    arr = fig.get("arrivals")
    if arr is not None:
        rate = "-" if arr["rate_per_s"] is None else f"{arr['rate_per_s']:.3g} sessions/s"
        cv = "-" if arr["gap_cv"] is None else f"{arr['gap_cv']:.2f}"
        lines.append(f"{'arrivals':<20}span {arr['span_s']:.1f} s, {rate}, gap CV {cv} (timestamps from the file)")
    else:
        lines.append(f"{'arrivals':<20}none in the source: the arrival process sets them (--arrival, --rate)")
    lines.extend(prefix_cache_lines(fig["prefix_cache"]))
    reader = fig.get("reader") or {}
    found: list[str] = []  # the reader's counts, of the whole file whatever -n covers
    dropped = reader.get("dropped")
    if dropped:
        found.append(f"{'left out':<20}" + ", ".join(f"{v} by {k}" for k, v in dropped.items()))
    if reader.get("trailing_user_turns_left_out"):
        found.append(f"{'':<20}{reader['trailing_user_turns_left_out']} last questions without a reply")
    if reader.get("empty_replies_left_out"):
        found.append(f"{'':<20}{reader['empty_replies_left_out']} questions whose reply has no text (left out with it)")
    if reader.get("zero_request_rows"):
        found.append(f"{'':<20}{reader['zero_request_rows']} requests with 0 prompt tokens (sent as 1 token)")
    chained = [
        (reader.get("orphan_chats"), "chats whose parent is not in the file (started sessions of their own)"),
        (reader.get("branch_chats"), "second children of a chat (started sessions of their own)"),
        (reader.get("context_not_grown"), "follow-ups whose context did not grow (sent a 1-token message)"),
    ]
    for count, what in chained:
        if count:
            found.append(f"{'':<20}{count} {what}")
    if reader.get("non_text_parts_skipped"):
        found.append(f"{'':<20}{reader['non_text_parts_skipped']} non-text content parts (images, audio) not sent")
    cut = held is None or fig["sessions"] < held
    lines.extend(f"{line} (whole file)" if cut else line for line in found)
    lines.append(f"{'tokenizer':<20}{fig['tokenizer']['name']} ({fig['tokenizer']['kind']})")
    return "\n".join(lines)


def prefix_cache_lines(pc: dict[str, Any]) -> list[str]:
    """The reuse line and the capacity that realises it; one line saying so when nothing is reused."""
    B = pc["block_size"]
    if not pc["reused_tokens"]:
        return [f"{'KV cache':<20}no prompt shares a leading block of {B} tokens with an earlier one: nothing to reuse"]
    need = pc["capacity_tokens_for"]
    return [
        f"{'prefix reuse':<20}{pc['reuse']:.1%} of prompt tokens are in leading blocks of {B} tokens an earlier "
        f"request sent (history included; replies as long as asked)",
        f"{'KV to realise it':<20}an LRU cache of {_tokens(need['50%'])} tokens gets half of it, "
        f"{_tokens(need['90%'])} 90%, {_tokens(need['99%'])} 99%, {_tokens(pc['working_set_tokens'])} all",
        f"{'hit rate by KV':<20}"
        + ", ".join(f"{_tokens(row['capacity_tokens'])} tokens {row['hit_rate']:.1%}" for row in pc["hit_rate_at"])
        + " (workload analyze --capacity for others)",
    ]


def _tokens(n: int) -> str:
    return f"{n:,}"


def _dist_line(d: dict[str, Any]) -> str:
    return (
        f"p50 {d['p50']:,.0f}  p90 {d['p90']:,.0f}  p99 {d['p99']:,.0f}  max {d['max']:,.0f}  "
        f"mean {d['mean']:,.1f}  total {d['total']:,.0f}"
    )
