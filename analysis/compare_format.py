"""A comparison dict as a terminal table, Markdown, JSON, or an overlaid CDF plot (SVG)."""

from __future__ import annotations

from typing import Any

import orjson

from analysis.compare import METRIC_NAMES, fmt_factor
from analysis.summary_format import fmt_ms
from analysis.svg import Series, line_chart

_HEADER = ["metric", "turns", "stat", "A", "B", "B-A", "B-A 95% CI", "B/A", "B/A 95% CI", "sig"]


def _ci(pair: list[float] | None, fmt) -> str:
    return "-" if pair is None else f"[{fmt(pair[0])}, {fmt(pair[1])}]"


def _ratio(x: float | None) -> str:
    return "-" if x is None else fmt_factor(x)


def _rows(cmp: dict[str, Any]) -> list[list[str]]:
    out = []
    for r in cmp["rows"]:
        out.append([
            r["metric"], r["turn_class"], r["stat"], fmt_ms(r["a"]), fmt_ms(r["b"]), fmt_ms(r["delta"]),
            _ci(r["delta_ci"], fmt_ms), _ratio(r["ratio"]), _ci(r["ratio_ci"], _ratio),
            "*" if r["significant"] else "" if r["significant"] is False else "-",
        ])  # fmt: skip
    return out


def describe_target(t: dict[str, Any]) -> str:
    """One line: label, URL, router and replicas of an embedded fleet, and the identity read before load."""
    ident = t.get("identity") or {}
    shown = {k: v for k, v in ident.items() if v is not None and not isinstance(v, dict | list)}
    if "base_url" in shown and shown["base_url"] == t.get("url"):
        shown.pop("base_url")
    bits = ", ".join(f"{k}={v}" for k, v in shown.items())
    fleet = t.get("fleet") or {}
    router = fleet.get("router") or {}
    via = ""
    if router:
        via = f" via {router.get('name')} {router.get('version')} policy={router.get('policy')}"
    if fleet:
        via += f" over {fleet.get('replicas')} {fleet.get('engine')} replica(s)"
    return f"{t.get('label')} {t.get('url') or ''}{via} [{bits}]".replace("  ", " ")


def _head(cmp: dict[str, Any]) -> list[str]:
    out = []
    for name in ("a", "b"):
        arm = cmp[name]
        partial = "  (PARTIAL)" if arm["partial"] else ""
        targets = "; ".join(describe_target(t) for t in arm["targets"])
        out.append(
            f"{name.upper()}: {arm['run_id']} ({arm['dir']}), {arm['requests']:,} requests{partial}  target {targets}"
        )
    out.append(
        f"{cmp['pairing']}; {cmp['n_boot']:,} bootstrap resamples, {cmp['confidence']:.0%} intervals, seed {cmp['seed']}"
    )
    out.append(f"significant: {significance(cmp)}; verdicts at {cmp.get('headline_stat', 'p95')}")
    return out


def significance(cmp: dict[str, Any]) -> str:
    """What makes a difference significant, in words: ``the 95% interval of B/A beyond ±5%``."""
    m = cmp.get("min_effect") or 0.0
    band = f"beyond \u00b1{100 * m:g}%" if m else "excludes 1"
    return f"the {cmp['confidence']:.0%} interval of B/A {band}"


def format_compare(cmp: dict[str, Any]) -> str:
    """Aligned plain text for a terminal: identities, verdicts, the full table and run figures."""
    lines = _head(cmp)
    lines += [f"warning: {w}" for w in cmp["warnings"]]
    lines.append("")
    lines += [f"  {v['text']}" for v in cmp["verdicts"]]
    lines.append("")
    rows = _rows(cmp)
    widths = [max(len(r[i]) for r in [_HEADER, *rows]) for i in range(len(_HEADER))]
    for r in [_HEADER, *rows]:
        lines.append(
            "  ".join(c.ljust(widths[i]) if i < 3 else c.rjust(widths[i]) for i, c in enumerate(r)).rstrip()
        )
    lines.append(
        f"(times in ms; sig *: {significance(cmp)}; -: too few values beyond the percentile to judge)"
    )
    lines.append("")
    for o in cmp["overview"]:
        ratio = "" if o["ratio"] is None else f"  (B/A {fmt_factor(o['ratio'])})"
        lines.append(f"{o['name']:<22} A {_num(o['a']):>12}   B {_num(o['b']):>12}{ratio}")
    return "\n".join(lines)


def compare_to_markdown(cmp: dict[str, Any]) -> str:
    """GitHub-flavoured Markdown: for a pull-request comment or a CI job summary."""
    lines = ["## loadgen compare", ""]
    lines += [f"- {h}" for h in _head(cmp)]
    lines += [f"- **warning:** {w}" for w in cmp["warnings"]]
    lines.append("")
    lines += [f"- {'**' + v['text'] + '**' if v['significant'] else v['text']}" for v in cmp["verdicts"]]
    lines += ["", "| " + " | ".join(_HEADER) + " |", "|" + "---|" * 3 + "---:|" * (len(_HEADER) - 3)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in _rows(cmp)]
    lines += [
        "",
        f"Times in ms; sig *: {significance(cmp)}; -: too few values beyond the percentile to judge.",
        "",
    ]
    lines += ["| run figure | A | B | B/A |", "|---|---:|---:|---:|"]
    for o in cmp["overview"]:
        lines.append(f"| {o['name']} | {_num(o['a'])} | {_num(o['b'])} | {_ratio(o['ratio'])} |")
    return "\n".join(lines) + "\n"


def compare_to_json(cmp: dict[str, Any]) -> str:
    return orjson.dumps(cmp, option=orjson.OPT_INDENT_2).decode()


def compare_cdf_svg(cmp: dict[str, Any], metric: str = "ttft", turn_class: str = "all") -> str:
    """A's and B's CDFs of ``metric`` overlaid (A solid, B dashed), log x axis when the data are wide."""
    data = (cmp.get("cdf") or {}).get(metric, {}).get(turn_class, {"a": [], "b": []})
    series = [
        Series(f"A {cmp['a']['run_id']}", [p[0] for p in data["a"]], [p[1] for p in data["a"]], step=True),
        Series(
            f"B {cmp['b']['run_id']}",
            [p[0] for p in data["b"]],
            [p[1] for p in data["b"]],
            step=True,
            dashed=True,
        ),
    ]
    turns = "" if turn_class == "all" else f", {turn_class} turns"
    return line_chart(
        series,
        title=f"{METRIC_NAMES.get(metric, metric)} CDF{turns}",
        x_label="ms",
        y_label="fraction of requests",
        x_log=None,
        y_min=0.0,
        y_max=1.0,
    )


def _num(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:,.4g}" if abs(v) < 1000 else f"{v:,.0f}"


__all__ = [
    "compare_cdf_svg",
    "compare_to_json",
    "compare_to_markdown",
    "describe_target",
    "format_compare",
    "significance",
]
