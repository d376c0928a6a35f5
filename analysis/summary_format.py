"""A summary dict as a terminal table (``format_summary``) or long-format CSV (``summary_to_csv``)."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from analysis.metric_registry import (
    STEP_KIND_FAN_OUT_CHILD,
    STEP_KIND_JOIN,
    SUMMARY_TABLE,
    metric,
    metrics_for,
)
from analysis.prompt_check import format_prompt_check
from analysis.records import METRICS
from analysis.target_checks import target_checks_lines

GROUPS = (("by_turn_class", "turn class"), ("by_tenant", "tenant"), ("by_target", "target"),
          ("by_model", "model"), ("by_hardware", "hardware"))  # fmt: skip
_STATS = ("p50", "p90", "p95", "p99", "p99.9", "mean", "max")


def fmt_ms(v: float | None) -> str:
    """A millisecond value for a table: 3 significant-ish digits, ``-`` when absent."""
    if v is None:
        return "-"
    a = abs(v)
    return f"{v:.2f}" if a < 10 else f"{v:.1f}" if a < 1000 else f"{v:,.0f}"


def fmt_num(v: float | None, nd: int = 2) -> str:
    if v is None:
        return "-"
    return f"{v:,.{nd}f}" if abs(v) < 1000 else f"{v:,.0f}"


def fmt_pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def describe_mode(summary: dict[str, Any]) -> str:
    """``open-loop, poisson 20/s`` or ``closed-loop, concurrency 8``."""
    arrival = summary.get("arrival") or {}
    mode = summary.get("mode") or "open-loop"
    if arrival.get("concurrency"):
        return f"{mode}, concurrency {arrival['concurrency']}"
    kind = arrival.get("kind") or "?"
    rate = arrival.get("rate_per_s")
    extra = f" {rate:g}/s" if isinstance(rate, int | float) else ""
    if arrival.get("burstiness") is not None:
        extra += f" (burstiness {arrival['burstiness']:g})"
    return f"{mode}, {kind}{extra}"


def load_summary(summary: dict[str, Any] | str | Path) -> dict[str, Any]:
    """A summary dict, given one or the path of a ``summary.json`` (what ``write_summary`` returns)."""
    if isinstance(summary, dict):
        return summary
    return orjson.loads(Path(summary).read_bytes())


def format_summary(summary: dict[str, Any] | str | Path) -> str:
    """The summary (a dict, or the path of summary.json) as aligned plain text for a terminal (ms)."""
    summary = load_summary(summary)
    out: list[str] = []
    wl = summary.get("workload") or {}
    out.append(
        f"run {summary['run_id']}  |  {summary['status']}  |  {describe_mode(summary)}  |  seed {summary.get('seed')}"
        f"  |  workload {wl.get('name', '?')} ({wl.get('fingerprint', '?')})"
    )
    if summary.get("partial"):
        out.append(f"PARTIAL: {summary['partial_reason']}")
    w, req, err = summary["window"], summary["requests"], summary["errors"]
    warm = f", warm-up {w['warmup_s']:g} s excluded" if w["warmup_s"] else ""
    out.append(
        f"window {w['start_s']:g}-{w['end_s']:g} s ({w['length_s']:g} s{warm})  |  {req['measured']:,} requests measured,"
        f" {err['total']:,} error{'' if err['total'] == 1 else 's'} ({fmt_pct(err['rate'])})"
    )
    tp = summary["throughput"]
    out.append(
        f"throughput  {fmt_num(tp['requests_per_s'])} req/s  |  {fmt_num(tp['input_tokens_per_s'], 1)} input tok/s"
        f"  |  {fmt_num(tp['output_tokens_per_s'], 1)} output tok/s"
    )
    out.append("")
    out.extend(_metric_table(summary["metrics"]))
    for key, title in GROUPS:
        groups = summary.get(key) or {}
        if groups:
            out.append("")
            out.extend(_group_table(title, groups))
    if summary.get("ttft_split"):
        out.append("")
        out.extend(_ttft_split_lines(summary["ttft_split"]))
    out.extend(_dag_lines(summary))
    out.append("")
    out.extend(_slo_lines(summary))
    out.extend(_cost_lines(summary))
    out.extend(energy_lines(summary))
    gen = summary["generator"]
    state = "SATURATED" if gen["saturated"] else "ok"
    cpu = f"  |  cpu p99 {gen['cpu_percent_p99']:g}%" if gen.get("cpu_percent_p99") is not None else ""
    for key, name in (("loop_lag_ms", "loop lag"), ("recv_delay_ms", "recv delay")):
        if (gen.get(key) or {}).get("p99") is not None:
            cpu += f"  |  {name} p99 {fmt_ms(gen[key]['p99'])} ms"
    out.append(
        f"generator   schedule lag p99 {fmt_ms(gen['schedule_lag_p99_ms'])} ms (bound {gen['saturation_bound_ms']:g} ms): {state}{cpu}"
    )
    if err["by_category"]:
        out.append("errors      " + "  ".join(f"{k} {v:,}" for k, v in err["by_category"].items()))
        if "server_faults" in err:
            out.append(f"            server faults {err['server_faults']:,}  client errors {err['client_errors']:,}")
    if err.get("throttled_retries"):
        out.append(f"throttled   {err['throttled_retries']:,} retries after 429 + Retry-After (not failures)")
    check = format_prompt_check(summary.get("prompt_tokens_check"))
    if check:
        out.append(check)
    out.extend(target_checks_lines(summary))
    if summary.get("notes"):
        out.append("notes")
        out.extend(f"  - {n}" for n in summary["notes"])
    return "\n".join(out)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r))  # noqa: E731
    return [line(header).rstrip(), *(line(r).rstrip() for r in rows)]


# The table's order (the registry's): each reasoning-aware metric beside its plain one, then the
# rest. An optional metric is absent from older results: no row rather than an empty one.
_TABLE_ORDER = metrics_for(SUMMARY_TABLE)
_TABLE_METRICS = (*_TABLE_ORDER, *(m for m in METRICS if m not in _TABLE_ORDER))


def _metric_table(metrics: dict[str, Any]) -> list[str]:
    rows = []
    for m in _TABLE_METRICS:
        d = metrics.get(m)
        if not d or (metric(m).optional and not d.get("count")):
            continue
        name = m if d["unit"] == "ms" else f"{m} ({d['unit']})"
        fmt = fmt_ms if d["unit"] == "ms" else (lambda v: fmt_num(v, 2))
        rows.append([name, f"{d['count']:,}", *(fmt(d.get(s)) for s in _STATS)])
    return _table(["metric (ms)", "count", *_STATS], rows)


def _has_metric(groups: dict[str, Any], metric: str) -> bool:
    """Whether any group recorded ``metric`` (TTFOT is absent from older results)."""
    return any(((g.get("metrics") or {}).get(metric) or {}).get("count") for g in groups.values())


def _ttfot_cells(m: dict[str, Any], shown: bool) -> list[str]:
    """TTFOT p50 and p99 beside TTFT's where the table shows them ("-" for a group without it)."""
    if not shown:
        return []
    d = m.get("ttfot") or {}
    return [fmt_ms(d.get("p50")), fmt_ms(d.get("p99"))]


def _group_table(title: str, groups: dict[str, Any]) -> list[str]:
    ttfot = _has_metric(groups, "ttfot")
    header = [
        f"by {title}",
        "reqs",
        "errors",
        "out tok/s",
        "ttft p50",
        "ttft p99",
        *(["ttfot p50", "ttfot p99"] if ttfot else []),
        "tpot p50",
        "itl p99",
        "e2e p99",
        "attain",
    ]
    rows = []
    for name, g in groups.items():
        m = g["metrics"]
        rows.append([
            name, f"{g['requests']['measured']:,}", f"{g['errors']['total']:,}",
            fmt_num(g["throughput"]["output_tokens_per_s"], 1),
            fmt_ms(m["ttft"]["p50"]), fmt_ms(m["ttft"]["p99"]), *_ttfot_cells(m, ttfot), fmt_ms(m["tpot"]["p50"]),
            fmt_ms(m["itl"]["p99"]), fmt_ms(m["e2e"]["p99"]), fmt_pct(g["slo"]["attainment"]),
        ])  # fmt: skip
    return _table(header, rows)


def _ttft_split_lines(split: dict[str, Any]) -> list[str]:
    """TTFT = (TTFT - prefill) + prefill per turn class, over the requests with server timings."""
    header = [
        "ttft split",
        "reqs",
        "ttft p50",
        "prefill p50",
        "prefill p99",
        "rest p50",
        "rest p99",
        "prefill",
        "cached",
    ]
    rows = []
    for name, g in [("all", split), *(split.get("by_turn_class") or {}).items()]:
        pre, rest = g["prefill_ms"], g["client_minus_prefill_ms"]
        rows.append([
            name, f"{g['requests']:,}", fmt_ms(g["ttft_ms"]["p50"]), fmt_ms(pre["p50"]), fmt_ms(pre["p99"]),
            fmt_ms(rest["p50"]), fmt_ms(rest["p99"]), fmt_pct(g["prefill_share"]), fmt_pct(g["cached_share"]),
        ])  # fmt: skip
    out = _table(header, rows)
    out.append(
        f"  {split['requests']:,} of {split['requests_with_ttft']:,} requests with server timings: prefill = "
        "timings.prompt_ms, rest = TTFT - prefill (network, HTTP, queue)"
    )
    out.append("  prefill: its share of TTFT; cached: share of prompt tokens from the server's prefix cache")
    if split["ttft_below_prefill"]:
        out.append(f"  {split['ttft_below_prefill']:,} request(s) had a TTFT below their server prefill time")
    return out


def _dag_lines(summary: dict[str, Any]) -> list[str]:
    """Step kinds and session times, for runs with fan-outs (a chain's step kinds are its turn classes)."""
    kinds = summary.get("by_step_kind") or {}
    if not any(k in kinds for k in (STEP_KIND_FAN_OUT_CHILD, STEP_KIND_JOIN)):
        return []
    ttfot = _has_metric(kinds, "ttfot")
    header = [
        "by step kind", "reqs", "errors", "ttft p50", "ttft p99", *(["ttfot p50", "ttfot p99"] if ttfot else []),
        "itl p50", "itl p99", "e2e p99",
    ]  # fmt: skip
    rows = []
    for name, g in kinds.items():
        m = g["metrics"]
        rows.append([
            name, f"{g['requests']:,}", f"{g['errors']:,}", fmt_ms(m["ttft"]["p50"]), fmt_ms(m["ttft"]["p99"]),
            *_ttfot_cells(m, ttfot), fmt_ms(m["itl"]["p50"]), fmt_ms(m["itl"]["p99"]), fmt_ms(m["e2e"]["p99"]),
        ])  # fmt: skip
    out = ["", *_table(header, rows)]
    ss = summary.get("sessions")
    if ss:
        task, over = ss["task_time"], ss["agent_overhead"]
        out.append(
            f"sessions    {ss['complete']:,} complete of {ss['measured']:,}  |  task time p50 {fmt_ms(task['p50'])} "
            f"p99 {fmt_ms(task['p99'])} ms  |  agent overhead p50 {fmt_ms(over['p50'])} p99 {fmt_ms(over['p99'])} ms"
            f" ({fmt_pct(ss['agent_overhead_share'])} of task time)"
        )
    return out


def _slo_lines(summary: dict[str, Any]) -> list[str]:
    slo = summary["slo"]
    out = []
    if slo["attainment"] is not None:
        per_request = [s for s in summary["slos"] if "_p" not in s.split("=")[0] and "_mean" not in s]
        out.append(
            f"SLOs        attainment {fmt_pct(slo['attainment'])} ({', '.join(per_request)})  |  goodput "
            f"{fmt_num(slo['goodput_requests_per_s'])} req/s, {fmt_num(slo['goodput_tokens_per_s'], 1)} tok/s"
        )
    for c in slo["percentile"]:
        state = "ok" if c["ok"] else "MISSED"
        out.append(f"            {c['slo']:<18} observed {fmt_ms(c['observed_ms'])} ms  {state}")
    return out


def _cost_lines(summary: dict[str, Any]) -> list[str]:
    out = []
    for label, g in (summary.get("by_target") or {}).items():
        c = g.get("cost")
        if c:
            per_m = c["usd_per_1m_output_tokens"]
            out.append(
                f"cost        {label}: ${c['cost_per_hour_usd']:,.2f}/h  |  {fmt_num(c['output_tokens_per_usd'], 0)} output tokens/$"
                f"  |  {'-' if per_m is None else f'${per_m:,.2f}' if per_m >= 1 else f'${per_m:.4f}'} per 1M output tokens"
            )
    return out


def energy_lines(summary: dict[str, Any]) -> list[str]:
    """The energy lines (``--power-metrics``): the run's, then each target's with its own GPUs."""
    if not summary.get("energy"):
        return []
    rows = [("all", summary["energy"])]
    rows += [(label, g["energy"]) for label, g in (summary.get("by_target") or {}).items() if g.get("energy")]
    out = []
    for label, e in rows:
        if e.get("energy_j") is None:
            out.append(f"energy      {label}: no figure (see the notes)")
            continue
        per_m = e.get("joules_per_1m_output_tokens")
        out.append(
            f"energy      {label}: {fmt_num(e['average_power_w'], 1)} W avg, {fmt_num(e['energy_j'], 1)} J  |  "
            f"{fmt_num(e['output_tokens_per_joule'], 3)} output tokens/J  |  "
            f"{'-' if per_m is None else f'{per_m:,.0f} J'} per 1M output tokens  ({e.get('method')})"
        )
    return out


def summary_to_csv(summary: dict[str, Any] | str | Path) -> str:
    """Long-format CSV: ``scope,group,metric,stat,value,unit``, one number a row."""
    summary = load_summary(summary)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["scope", "group", "metric", "stat", "value", "unit"])
    w.writerows(_group_rows("all", "", summary))
    for key, _ in GROUPS:
        for name, g in (summary.get(key) or {}).items():
            w.writerows(_group_rows(key.removeprefix("by_"), name, g))
    split = summary.get("ttft_split")
    if split:
        for name, g in [("", split), *(split.get("by_turn_class") or {}).items()]:
            w.writerows(_ttft_split_rows(name, g))
    for name, g in (summary.get("by_step_kind") or {}).items():
        w.writerows(_distribution_rows("step_kind", name, g["metrics"]))
    sessions = summary.get("sessions")
    if sessions:
        w.writerows(_distribution_rows("sessions", "", {k: sessions[k] for k in ("task_time", "agent_overhead")}))
        w.writerow(["sessions", "", "agent_overhead_share", "value", _cell(sessions["agent_overhead_share"]), "fraction"])
    return buf.getvalue()


def _distribution_rows(scope: str, group: str, metrics: dict[str, Any]) -> Iterator[list[Any]]:
    for m, d in metrics.items():
        for stat in ("count", "min", "mean", "max", *(k for k in d if k.startswith("p"))):
            yield [scope, group, m, stat, _cell(d.get(stat)), "count" if stat == "count" else d["unit"]]


def _ttft_split_rows(group: str, g: dict[str, Any]) -> Iterator[list[Any]]:
    for m in ("ttft_ms", "prefill_ms", "client_minus_prefill_ms"):
        d = g[m]
        for stat in ("count", "min", "mean", "max", *(k for k in d if k.startswith("p"))):
            yield [
                "ttft_split",
                group,
                m.removesuffix("_ms"),
                stat,
                _cell(d.get(stat)),
                "count" if stat == "count" else "ms",
            ]
    for k in ("prefill_share", "cached_share"):
        yield ["ttft_split", group, k, "value", _cell(g[k]), "fraction"]
    for k in ("prompt_tokens_evaluated", "prompt_tokens_cached"):
        yield ["ttft_split", group, k, "total", _cell(g[k]), "tokens"]


def _group_rows(scope: str, group: str, g: dict[str, Any]) -> Iterator[list[Any]]:
    for m, d in g["metrics"].items():
        for stat in ("count", "min", "mean", "max", *(k for k in d if k.startswith("p"))):
            yield [scope, group, m, stat, _cell(d.get(stat)), "count" if stat == "count" else d["unit"]]
    for k, v in g["throughput"].items():
        unit = "s" if k == "window_s" else "tokens" if k.endswith("_tokens") else "1/s"
        yield [scope, group, "throughput", k, _cell(v), unit]
    for k, v in g["requests"].items():
        yield [scope, group, "requests", k, v, "count"]
    yield [scope, group, "errors", "total", g["errors"]["total"], "count"]
    yield [scope, group, "errors", "rate", _cell(g["errors"]["rate"]), "fraction"]
    for k, v in g["errors"]["by_category"].items():
        yield [scope, group, "errors", k, v, "count"]
    slo = g["slo"]
    for k, unit in (
        ("attainment", "fraction"),
        ("goodput_requests_per_s", "1/s"),
        ("goodput_tokens_per_s", "1/s"),
    ):
        if slo[k] is not None:
            yield [scope, group, "slo", k, _cell(slo[k]), unit]
    for c in slo["percentile"]:
        yield [scope, group, "slo", c["slo"], _cell(c["observed_ms"]), "ms"]
    energy = g.get("energy") or {}
    for k, unit in (("average_power_w", "W"), ("energy_j", "J"), ("output_tokens_per_joule", "output_tokens"),
                    ("joules_per_1m_output_tokens", "J")):  # fmt: skip
        if energy.get(k) is not None:
            yield [scope, group, "energy", k, _cell(energy[k]), unit]
    for k, v in (g.get("cost") or {}).items():
        yield [
            scope,
            group,
            "cost",
            k,
            _cell(v),
            "usd/h" if k == "cost_per_hour_usd" else k.split("_per_")[0],
        ]


def _cell(v: Any) -> Any:
    return "" if v is None else v


__all__ = ["describe_mode", "energy_lines", "fmt_ms", "format_summary", "load_summary", "summary_to_csv"]
