"""``loadgen workload inspect``: what a workload holds, before any load is sent.

Sessions and turns, token distributions (new tokens per turn, output ``max_tokens``, and the
context the last turn sends when every earlier reply is as long as asked), think times, the
arrival span of a file with timestamps, and the reader's own figures (drops, prefix reuse).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from workloads.text import BUILTIN, TextTokenizer
from workloads.workload import Workload

DEFAULT_SYNTHETIC_SESSIONS = 100


def inspect_workload(
    workload: Workload, *, seed: int = 0, n: int | None = None, tokenizer: TextTokenizer = BUILTIN
) -> dict[str, Any]:
    """Figures of sessions ``0..n-1`` (all of a file; ``DEFAULT_SYNTHETIC_SESSIONS`` of a spec)."""
    total = workload.num_sessions
    if n is None:
        n = total if total is not None else DEFAULT_SYNTHETIC_SESSIONS
    elif total is not None:
        n = min(n, total)
    turns_per: list[int] = []
    first_in: list[int] = []
    follow_in: list[int] = []
    outputs: list[int] = []
    context: list[int] = []
    thinks: list[float] = []
    roles: dict[str, int] = {}
    tenants: dict[str, int] = {}
    for s in workload.sessions(seed, n):
        turns_per.append(len(s.turns))
        tenants[s.tenant] = tenants.get(s.tenant, 0) + 1
        ctx = tokenizer.count(s.system_prompt)
        for i, t in enumerate(s.turns):
            n_in = tokenizer.count(t.content)
            (first_in if i == 0 else follow_in).append(n_in)
            if i > 0:
                thinks.append(t.think_time_s)
            outputs.append(t.max_tokens)
            roles[t.role] = roles.get(t.role, 0) + 1
            ctx += n_in
            if i < len(s.turns) - 1:
                ctx += t.max_tokens
        context.append(ctx)
    out: dict[str, Any] = {
        "workload": workload.to_dict(),
        "seed": seed,
        "sessions": n,
        "sessions_in_source": total,
        "turns": int(sum(turns_per)),
        "tenants": tenants,
        "roles": roles,
        "turns_per_session": _dist(turns_per),
        "first_turn_tokens": _dist(first_in),
        "follow_up_tokens": _dist(follow_in),
        "output_tokens": _dist(outputs),
        "last_turn_context_tokens": _dist(context),
        "think_time_s": _dist(thinks),
        "tokenizer": tokenizer.describe(),
    }
    offsets = workload.arrival_offsets()
    if offsets is not None:
        out["arrivals"] = arrival_figures(offsets[:n])
    stats = getattr(workload, "stats", None)
    if stats:
        out["reader"] = stats
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


def _dist(values: list[int] | list[float]) -> dict[str, Any] | None:
    if not values:
        return None
    a = np.asarray(values, dtype=np.float64)
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {
        "count": len(a),
        "min": float(a.min()),
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
        "max": float(a.max()),
        "mean": float(a.mean()),
        "total": float(a.sum()),
    }


def format_inspection(fig: dict[str, Any]) -> str:
    """The report ``loadgen workload inspect`` prints."""
    wl = fig["workload"]
    held = fig["sessions_in_source"]
    scope = f"{fig['sessions']} sessions" + ("" if held is None else f" of {held}")
    if held is None:
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
    reader = fig.get("reader") or {}
    if "prefix_reuse" in reader:
        lines.append(
            f"{'prefix reuse':<20}{reader['prefix_reuse']:.1%} of prompt tokens are in leading blocks an earlier "
            f"request sent ({reader['unique_blocks']:,} unique blocks of {reader['block_size']} tokens)"
        )
    dropped = reader.get("dropped")
    if dropped:
        lines.append(f"{'left out':<20}" + ", ".join(f"{v} by {k}" for k, v in dropped.items()))
    if reader.get("trailing_user_turns_left_out"):
        lines.append(f"{'':<20}{reader['trailing_user_turns_left_out']} last questions without a reply")
    if reader.get("empty_replies_left_out"):
        lines.append(f"{'':<20}{reader['empty_replies_left_out']} questions whose reply has no text (left out with it)")
    if reader.get("zero_request_rows"):
        lines.append(f"{'':<20}{reader['zero_request_rows']} requests with 0 prompt tokens (sent as 1 token)")
    chained = [
        (reader.get("orphan_chats"), "chats whose parent is not in the file (started sessions of their own)"),
        (reader.get("branch_chats"), "second children of a chat (started sessions of their own)"),
        (reader.get("context_not_grown"), "follow-ups whose context did not grow (sent a 1-token message)"),
    ]
    for count, what in chained:
        if count:
            lines.append(f"{'':<20}{count} {what}")
    if reader.get("non_text_parts_skipped"):
        lines.append(f"{'':<20}{reader['non_text_parts_skipped']} non-text content parts (images, audio) not sent")
    lines.append(f"{'tokenizer':<20}{fig['tokenizer']['name']} ({fig['tokenizer']['kind']})")
    return "\n".join(lines)


def _dist_line(d: dict[str, Any]) -> str:
    return (
        f"p50 {d['p50']:,.0f}  p90 {d['p90']:,.0f}  p99 {d['p99']:,.0f}  max {d['max']:,.0f}  "
        f"mean {d['mean']:,.1f}  total {d['total']:,.0f}"
    )
