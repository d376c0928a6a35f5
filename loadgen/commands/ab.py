"""``loadgen ab``: the same seeded workload once per arm, each against a fresh fleet.

Each arm gets its own embedded fleet (so caches start cold), its own complete results directory,
and the same seed, so session k is the same conversation in both arms and the comparison is
paired. The side-by-side table shows TTFT (and TTFOT where an arm has it) per turn class and the
ratio B/A per statistic.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson

from analysis.metric_registry import AB, TURN_CLASS_FIRST, TURN_CLASS_FOLLOW_UP, metrics_for
from analysis.metric_registry import metric as registered_metric
from analysis.records import SUMMARY_FILE
from analysis.units import format_duration_us
from loadgen.commands.run import RunOptions, run
from loadgen.commands.server_scrape import SERVER_METRICS_FILE
from loadgen.errors import UserError
from loadgen.runtime.locust_options import new_run_id

AB_STATS = ("mean", "p50", "p95", "p99")
# Counters of generation requests a replica received, by engine (the sim's; vLLM's and SGLang's).
REPLICA_REQUEST_COUNTERS = ("sim:requests_total", "vllm:request_success_total", "sglang:num_requests_total")


def parse_arms(text: str) -> list[tuple[str, str]]:
    """``name=router,name=router`` -> [(name, router)]; at least two arms with distinct names."""
    arms: list[tuple[str, str]] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, sep, router = part.partition("=")
        if not sep or not name.strip() or not router.strip():
            raise UserError(
                f"--arms: {part!r} is not NAME=ROUTER; use e.g. rr=sglang:round_robin,ca=sglang:cache_aware"
            )
        arms.append((name.strip(), router.strip()))
    if len(arms) < 2:
        raise UserError("--arms needs at least two arms, e.g. rr=sglang:round_robin,ca=sglang:cache_aware")
    names = [a[0] for a in arms]
    if len(set(names)) != len(names):
        raise UserError(f"--arms: arm names must differ (got {', '.join(names)})")
    return arms


def run_ab(arms: list[tuple[str, str]], base: RunOptions) -> tuple[int, list[Path]]:
    """Run every arm; returns (worst exit code, results directories in arm order)."""
    if base.target:
        raise UserError(
            "loadgen ab starts a fresh fleet per arm; drop --target (or run each arm with 'loadgen run')"
        )
    stem = base.run_id or new_run_id(base.workload)
    dirs: list[Path] = []
    worst = 0
    for name, router in arms:
        opts = replace(base, router=router, run_id=f"{stem}-{name}", target_label=name)
        engine = opts.profile if opts.engine == "sim" else opts.engine
        print(f"\n== arm {name}: {router} x{opts.replicas} ({engine}) ==", file=sys.stderr, flush=True)
        code = run(opts)
        worst = max(worst, code)
        dirs.append(Path(opts.results) / opts.run_id)
    return worst, dirs


def load_summary(run_dir: Path) -> dict[str, Any]:
    path = run_dir / SUMMARY_FILE
    if not path.exists():
        raise UserError(f"{run_dir}: no {SUMMARY_FILE}; the arm did not finish (see its output above)")
    return orjson.loads(path.read_bytes())


def summary_stat(summary: dict[str, Any], turn_class: str | None, metric: str, stat: str) -> float | None:
    """One statistic (ms) of a summary.json, for one turn class (None: all turns); None if absent."""
    group = summary if turn_class is None else (summary.get("by_turn_class") or {}).get(turn_class) or {}
    return ((group.get("metrics") or {}).get(metric) or {}).get(stat)


def side_by_side(
    names: list[str], summaries: list[dict[str, Any]], metrics: tuple[str, ...] = ("ttft",)
) -> str:
    """A table: rows (metric, turn class, stat), a column per arm, and B/A ratios against the first arm."""
    base_name = names[0]
    header = ["metric", "turns", "stat", *names, *[f"{n}/{base_name}" for n in names[1:]]]
    rows = [header]
    for metric in metrics:
        for tc in (TURN_CLASS_FIRST, TURN_CLASS_FOLLOW_UP, None):
            for stat in AB_STATS:
                vals = [summary_stat(s, tc, metric, stat) for s in summaries]
                ratios = []
                for v in vals[1:]:
                    a = vals[0]
                    ratios.append("-" if a in (None, 0) or v is None else f"{v / a:.2f}x")
                rows.append(
                    [
                        metric,
                        tc or "all",
                        stat,
                        *[format_duration_us(None if v is None else v * 1000.0) for v in vals],
                        *ratios,
                    ]
                )
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(header))]
    lines = [
        "  ".join(
            str(c).rjust(w) if i > 2 else str(c).ljust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def follow_up_ttft_factors(
    base: dict[str, Any], other: dict[str, Any], stats: tuple[str, ...] = ("mean", "p95")
) -> dict[str, float | None]:
    """stat -> how many times lower ``other``'s follow-up-turn TTFT is than ``base``'s (above 1:
    lower; None when either arm has no follow-up turns)."""
    out: dict[str, float | None] = {}
    for stat in stats:
        a, b = summary_stat(base, TURN_CLASS_FOLLOW_UP, "ttft", stat), summary_stat(other, TURN_CLASS_FOLLOW_UP, "ttft", stat)
        out[stat] = a / b if a and b else None
    return out


def headline(names: list[str], summaries: list[dict[str, Any]]) -> str:
    """One line per extra arm: how follow-up-turn TTFT moved against the first arm (mean, p95)."""
    out = []
    for name, s in zip(names[1:], summaries[1:], strict=True):
        parts = []
        for stat in ("mean", "p95"):
            a = summary_stat(summaries[0], TURN_CLASS_FOLLOW_UP, "ttft", stat)
            b = summary_stat(s, TURN_CLASS_FOLLOW_UP, "ttft", stat)
            if a and b:
                factor, word = (a / b, "lower") if b <= a else (b / a, "higher")
                parts.append(
                    f"{stat} {factor:.1f}x {word} ({format_duration_us(a * 1000)} -> {format_duration_us(b * 1000)})"
                )
        if parts:
            out.append(f"{name} vs {names[0]}: follow-up-turn TTFT " + ", ".join(parts))
    return "\n".join(out)


def _replica_line(run_dir: Path) -> str | None:
    """``replica-0 19 requests (prefix-cache hits 76%), replica-1 18 (78%)`` from
    server-metrics.json (each replica's /metrics before and after the run); None without it."""
    path = run_dir / SERVER_METRICS_FILE
    if not path.exists():
        return None
    parts = []
    for name, entry in orjson.loads(path.read_bytes()).items():
        if name == "router" or "during_run" not in entry:
            continue
        counters = entry.get("counters") or {}
        # The first counter the replica has: the sim exports vLLM's names beside its own, and
        # summing both would count each request twice.
        present = [c for c in REPLICA_REQUEST_COUNTERS if any(k.split("{", 1)[0] == c for k in counters)]
        served = [v for k, v in counters.items() if present and k.split("{", 1)[0] == present[0]]
        hit_rate = (entry.get("during_run") or {}).get("prefix_cache_hit_rate")
        hits = "" if hit_rate is None else f"prefix-cache hits {hit_rate:.0%}"
        # llama-server counts tokens, not requests: then only its cache hits are shown.
        if served:
            parts.append(f"{name} {sum(served):.0f} requests" + (f" ({hits})" if hits else ""))
        elif hits:
            parts.append(f"{name} {hits}")
    return ", ".join(parts) or None


def replica_lines(names: list[str], dirs: list[Path]) -> str:
    """Per arm, how the router spread the requests and how often each replica's cache hit."""
    lines = [(name, _replica_line(d)) for name, d in zip(names, dirs, strict=True)]
    width = max(len(n) for n in names)
    return "\n".join(f"{name.ljust(width)}  {line}" for name, line in lines if line)


def table_metrics(summaries: list[dict[str, Any]]) -> tuple[str, ...]:
    """The side-by-side table's metrics (the registry's ``ab`` view): TTFT, and TTFOT beside it
    where an arm recorded it (an optional metric, e.g. a reasoning model's first answer token,
    shows only where some arm has values: absent from older results)."""
    return tuple(
        m
        for m in metrics_for(AB)
        if not registered_metric(m).optional
        or any(((s.get("metrics") or {}).get(m) or {}).get("count") for s in summaries)
    )


def report_ab(names: list[str], dirs: list[Path]) -> str:
    summaries = [load_summary(d) for d in dirs]
    text = side_by_side(names, summaries, table_metrics(summaries))
    spread = replica_lines(names, dirs)
    if spread:
        text += "\n\nrequests per replica (from each replica's /metrics)\n" + spread
    return f"{text}\n\n{headline(names, summaries)}\nresults: " + ", ".join(str(d) for d in dirs)
