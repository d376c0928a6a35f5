"""Self-contained HTML reports (inline CSS and SVG, no script, no network).

* ``render_report(run_dir)``: one run. Headline table, SLOs, throughput/goodput/cost, TTFT and ITL
  CDFs, TTFT by turn index, TTFT split into server prefill and network + queue (from server
  timings), throughput and in-flight sessions over time, latency and schedule lag over time, errors
  by category, breakdowns, target identities and the run's configuration. A partial run says so at
  the top.
* ``render_compare_report(cmp)``: an A/B comparison from ``compare.compare_runs``.
* ``render_sweep_report(result)``: a ``sweep.SweepResult``.

Every section is a ``<section id="...">`` (ids in ``RUN_SECTIONS``), so tools and tests can find them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson

from analysis import hdr, hlog, timeseries
from analysis.compare import HEADLINES, METRIC_NAMES
from analysis.compare_format import compare_cdf_svg, describe_target, significance
from analysis.html import Raw, charts, esc, ok_mark, page, section, table
from analysis.metric_registry import ALL_TURNS, SWEEP, TURN_CLASS_FOLLOW_UP, TURN_CLASSES, metrics_for
from analysis.records import METRICS, REPORT_FILE, parse_histogram_tag
from analysis.results import RunResults, load_results
from analysis.slo import parse_slos
from analysis.summary import summarize_results
from analysis.summary_format import GROUPS, describe_mode, fmt_ms, fmt_num, fmt_pct
from analysis.svg import Mark, Series, bar_chart, line_chart
from analysis.sweep import HOLDS, HOLDS_WORDS, SLO_MISSED, SweepResult, describe_max, key_figures
from analysis.target_checks import target_checks_html

RUN_SECTIONS = (
    "headline", "slo", "throughput", "ttft-cdf", "itl-cdf", "ttft-by-turn", "ttft-split", "over-time", "in-flight",
    "latency-over-time", "schedule-lag", "errors", "breakdown", "targets", "config",
)  # fmt: skip
_STATS = ("p50", "p90", "p95", "p99", "p99.9", "mean", "max")


def render_report(run_dir: str | Path, **summary_kwargs: Any) -> str:
    """The HTML report of the run in ``run_dir``; keyword arguments go to the summary (slos, cost)."""
    res = load_results(run_dir)
    s = summarize_results(res, **summary_kwargs)
    return page(f"loadgen report: {s['run_id']}", _run_body(res, s))


def write_report(run_dir: str | Path, **summary_kwargs: Any) -> Path:
    """Write ``report.html`` into ``run_dir`` (atomically) and return its path."""
    path = Path(run_dir) / REPORT_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(render_report(run_dir, **summary_kwargs), encoding="utf-8")
    os.replace(tmp, path)
    return path


# ---------------------------------------------------------------------------------------------- one run


def _run_body(res: RunResults, s: dict[str, Any]) -> list[str]:
    hists = res.histograms()
    span = timeseries.span_s(res)
    width = timeseries.bucket_width_s(span)
    shade = (0.0, s["window"]["warmup_s"], "warm-up") if s["window"]["warmup_s"] else None
    end_mark = (
        [Mark(s["window"]["end_s"], "window end", axis="x")]
        if s["window"]["end_source"] == "duration_s"
        else []
    )
    tp = timeseries.throughput(res.records, width, span)
    fl = timeseries.in_flight(res.records, width, span)
    lat = timeseries.interval_percentiles(res, "ttft", (50.0, 90.0, 99.0))
    lag = timeseries.interval_percentiles(res, "schedule_lag", (50.0, 99.0, 100.0))
    by_turn = timeseries.ttft_by_turn(res.measured())
    over = dict(shade=shade, marks=end_mark, x_label="seconds since start")
    out = [_run_header(s)]
    out.append(section("headline", "Latency (ms)", _metric_table(s["metrics"]), _figures(s)))
    out.append(section("slo", "SLOs", _slo_block(s)))
    out.append(section("throughput", "Throughput, goodput and cost", _throughput_block(s)))
    out.append(
        section(
            "ttft-cdf",
            "TTFT distribution",
            charts(_cdf_chart(hists, "ttft"), _cdf_chart(hists, "ttft_sched")),
        )
    )
    out.append(
        section(
            "itl-cdf",
            "ITL and TPOT distributions",
            charts(_cdf_chart(hists, "itl"), _cdf_chart(hists, "tpot")),
        )
    )
    turn_series = [Series(k, by_turn.t_s, by_turn.values[k], markers=True) for k in ("p50", "p90", "p99")]
    out.append(section("ttft-by-turn", "TTFT by turn index", charts(
        line_chart(turn_series, title="TTFT by turn index (measured requests)", x_label="turn index", y_label="ms"))))  # fmt: skip
    out.append(section("ttft-split", "TTFT split: prefill vs network and queue", _ttft_split_block(s)))
    out.append(section("over-time", "Throughput over time", charts(
        line_chart([Series("output tokens/s", tp.t_s, tp.values["output tokens/s"])], title="Output tokens/s",
                   y_label="tokens/s", y_min=0, **over),
        line_chart([Series("requests/s", tp.t_s, tp.values["requests/s"]), Series("errors/s", tp.t_s, tp.values["errors/s"], dashed=True)],
                   title="Requests/s by completion time", y_label="per second", y_min=0, **over))))  # fmt: skip
    out.append(section("in-flight", "In flight", charts(line_chart(
        [Series("sessions", fl.t_s, fl.values["sessions"]), Series("requests", fl.t_s, fl.values["requests"], dashed=True)],
        title="Sessions and requests in flight", y_label="count", y_min=0, **over))))  # fmt: skip
    out.append(section("latency-over-time", "Latency over time", charts(line_chart(
        [Series(k, lat.t_s, v) for k, v in lat.values.items()], title="TTFT per interval", y_label="ms", y_min=0, **over))))  # fmt: skip
    gen = s["generator"]
    verdict = ok_mark(not gen["saturated"], "generator kept up", "generator SATURATED").html
    lag_chart = line_chart([Series("max" if k == "p100" else k, lag.t_s, v) for k, v in lag.values.items()],
                           title="Schedule lag per interval", y_label="ms", y_min=0,
                           marks=[Mark(gen["saturation_bound_ms"], "saturation bound"), *end_mark],
                           shade=shade, x_label="seconds since start")  # fmt: skip
    out.append(section("schedule-lag", "Schedule lag (the generator's own health)", f"<p>{verdict}: p99 "
        f"{esc(fmt_ms(gen['schedule_lag_p99_ms']))} ms against a bound of {gen['saturation_bound_ms']:g} ms.</p>",
        charts(lag_chart)))  # fmt: skip
    out.append(section("errors", "Errors by category", _errors_block(s)))
    out.append(
        section("breakdown", "Breakdowns", *(_group_table(title, s.get(key) or {}) for key, title in GROUPS))
    )
    out.append(section("targets", "Targets", _targets_block(s), target_checks_html(s)))
    out.append(section("config", "Configuration (run.json)", f"<pre>{esc(_pretty(res.info))}</pre>"))
    out.append(
        f"<footer>summary schema {s['schema_version']}; latency from {esc(s['histogram_source'])}</footer>"
    )
    return out


def _run_header(s: dict[str, Any]) -> str:
    wl = s["workload"] or {}
    badge = (
        '<span class="badge bad">partial</span>'
        if s["partial"]
        else '<span class="badge good">complete</span>'
    )
    parts = [f"<h1>loadgen report: {esc(s['run_id'])} {badge}</h1>"]
    parts.append(
        f'<p class="meta">{esc(describe_mode(s))} &middot; seed {esc(s["seed"])} &middot; workload '
        f"{esc(wl.get('name'))} ({esc(wl.get('fingerprint'))}) &middot; window {s['window']['start_s']:g}-"
        f"{s['window']['end_s']:g} s &middot; {esc(s['started_at'])} to {esc(s['ended_at'] or 'not ended')}</p>"
    )
    if s["partial"]:
        parts.append(f'<div class="banner bad"><b>Partial run.</b> {esc(s["partial_reason"])}</div>')
    if s["generator_saturated"]:
        parts.append(
            '<div class="banner bad"><b>Generator saturated.</b> Latencies include client-side delay.</div>'
        )
    parts += [f'<div class="banner warn">{esc(n)}</div>' for n in s["notes"]]
    return "".join(parts)


def _metric_table(metrics: dict[str, Any]) -> str:
    rows = []
    for m in METRICS:
        d = metrics.get(m)
        if not d or (m in ("ttfot", "tpot_output") and not d.get("count")):
            continue  # a summary from before the metric, or a run without its values
        f = fmt_ms if d["unit"] == "ms" else (lambda v: fmt_num(v, 2))
        rows.append(
            [m if d["unit"] == "ms" else f"{m} (tokens)", f"{d['count']:,}", *(f(d.get(k)) for k in _STATS)]
        )
    return table(["metric", "count", *_STATS], rows)


def _figures(s: dict[str, Any]) -> str:
    tp, req, err = s["throughput"], s["requests"], s["errors"]
    return table(["figure", "value"], [
        ["measured requests", f"{req['measured']:,}"], ["errors", f"{err['total']:,} ({fmt_pct(err['rate'])})"],
        ["requests/s", fmt_num(tp["requests_per_s"])], ["output tokens/s", fmt_num(tp["output_tokens_per_s"], 1)],
        ["input tokens/s", fmt_num(tp["input_tokens_per_s"], 1)], ["SLO attainment", fmt_pct(s["slo"]["attainment"])],
    ])  # fmt: skip


def _slo_block(s: dict[str, Any]) -> str:
    slo = s["slo"]
    if not s["slos"]:
        return '<p class="muted">No SLOs were given (pass e.g. --slo ttft_p99=500ms,tpot=80ms).</p>'
    rows = [
        [c["slo"], fmt_ms(c["observed_ms"]), f"{c['limit_ms']:g}", ok_mark(c["ok"])]
        for c in slo["percentile"]
    ]
    parts = [table(["percentile SLO", "observed ms", "limit ms", ""], rows)] if rows else []
    if slo["attainment"] is not None:
        parts.append(table(["per-request SLOs", "attainment", "requests meeting", "goodput req/s", "goodput tok/s"], [[
            ", ".join(x for x in s["slos"] if "_p" not in x.split("=")[0] and "_mean" not in x), fmt_pct(slo["attainment"]),
            f"{slo['requests_meeting']:,}", fmt_num(slo["goodput_requests_per_s"]), fmt_num(slo["goodput_tokens_per_s"], 1)]]))  # fmt: skip
    return "".join(parts)


def _throughput_block(s: dict[str, Any]) -> str:
    rows = []
    for label, g in [("all targets", s), *(s.get("by_target") or {}).items()]:
        c = g["cost"] or {}
        rows.append([label, fmt_num(g["throughput"]["requests_per_s"]), fmt_num(g["throughput"]["output_tokens_per_s"], 1),
                     fmt_num(g["slo"]["goodput_tokens_per_s"], 1), fmt_num(c.get("cost_per_hour_usd")),
                     fmt_num(c.get("output_tokens_per_usd"), 0), fmt_num(c.get("usd_per_1m_output_tokens"), 4)])  # fmt: skip
        if s.get("energy"):  # --power-metrics: energy beside the cost (docs/metrics.md "Energy")
            e = g.get("energy") or {}
            rows[-1] += [fmt_num(e.get("average_power_w"), 1), fmt_num(e.get("energy_j"), 1),
                         fmt_num(e.get("output_tokens_per_joule"), 3), fmt_num(e.get("joules_per_1m_output_tokens"), 0)]  # fmt: skip
    head = [
        "",
        "requests/s",
        "output tok/s",
        "goodput tok/s",
        "$/hour",
        "output tokens/$",
        "$ per 1M output tokens",
    ]
    if s.get("energy"):
        head += ["avg GPU W", "GPU energy J", "output tokens/J", "J per 1M output tokens"]
    return (
        table(head, rows)
        + f'<p class="muted">Over the measurement window ({s["window"]["length_s"]:g} s, warm-up excluded).</p>'
    )


def _cdf_chart(hists: dict[str, Any], metric: str) -> str:
    series = []
    for tc in (ALL_TURNS, *TURN_CLASSES):
        tags = [
            t
            for t in hists
            if parse_histogram_tag(t)[0] == metric and tc in (ALL_TURNS, parse_histogram_tag(t)[1])
        ]
        b = hdr.bins(hlog.merge(hists[t] for t in tags))
        x, y = hdr.cdf(b)
        name = "all turns" if tc == ALL_TURNS else f"{tc} turns"
        series.append(Series(name, list(x / 1000.0), list(y), step=True, dashed=tc == TURN_CLASS_FOLLOW_UP))
    return line_chart(series, title=f"{METRIC_NAMES.get(metric, metric)} CDF", x_label="ms",
                      y_label="fraction", x_log=None, y_min=0, y_max=1)  # fmt: skip


def _ttft_split_block(s: dict[str, Any]) -> str:
    split = s.get("ttft_split")
    if not split:
        return (
            '<p class="muted">No server timings: the split needs an engine that reports its prompt time per '
            "request (llama-server's <code>timings.prompt_ms</code>).</p>"
        )
    rows = []
    for name, g in [("all turns", split), *(split.get("by_turn_class") or {}).items()]:
        pre, rest, ttft = g["prefill_ms"], g["client_minus_prefill_ms"], g["ttft_ms"]
        rows.append([name, f"{g['requests']:,}", fmt_ms(ttft["p50"]), fmt_ms(ttft["p99"]), fmt_ms(pre["p50"]),
                     fmt_ms(pre["p99"]), fmt_ms(rest["p50"]), fmt_ms(rest["p99"]), fmt_pct(g["prefill_share"]),
                     fmt_pct(g["cached_share"])])  # fmt: skip
    head = ["", "requests", "ttft p50", "ttft p99", "prefill p50", "prefill p99", "ttft - prefill p50",
            "ttft - prefill p99", "prefill share of ttft", "cached prompt tokens"]  # fmt: skip
    note = (
        f'<p class="muted">{split["requests"]:,} of {split["requests_with_ttft"]:,} successful requests carry '
        "server timings. Prefill is the engine's own <code>timings.prompt_ms</code>; TTFT - prefill is "
        "network, HTTP, router and the wait for a free slot (queue). Cached prompt tokens: "
        "<code>cache_n</code> / (<code>cache_n</code> + <code>prompt_n</code>).</p>"
    )
    if split["ttft_below_prefill"]:
        note += (
            f'<div class="banner warn">{split["ttft_below_prefill"]:,} request(s) had a TTFT below their '
            "server prefill time (counted as 0 ms of network and queue).</div>"
        )
    return table(head, rows) + note


def _errors_block(s: dict[str, Any]) -> str:
    by = s["errors"]["by_category"]
    if not by:
        return '<p class="muted">No errors.</p>'
    return charts(
        bar_chart(list(by), list(by.values()), title="Errors by category", y_label="requests")
    ) + table(
        ["category", "requests", "share of measured"],
        [[k, f"{v:,}", fmt_pct(v / max(1, s["requests"]["measured"]))] for k, v in by.items()],
    )


def _group_table(title: str, groups: dict[str, Any]) -> str:
    if not groups:
        return ""
    rows = [[name, f"{g['requests']['measured']:,}", f"{g['errors']['total']:,}", fmt_num(g["throughput"]["output_tokens_per_s"], 1),
             fmt_ms(g["metrics"]["ttft"]["p50"]), fmt_ms(g["metrics"]["ttft"]["p99"]), fmt_ms(g["metrics"]["tpot"]["p50"]),
             fmt_ms(g["metrics"]["itl"]["p99"]), fmt_ms(g["metrics"]["e2e"]["p99"]), fmt_pct(g["slo"]["attainment"])]
            for name, g in groups.items()]  # fmt: skip
    head = [
        title,
        "requests",
        "errors",
        "out tok/s",
        "ttft p50",
        "ttft p99",
        "tpot p50",
        "itl p99",
        "e2e p99",
        "attainment",
    ]
    return f"<h3>By {esc(title)}</h3>" + table(head, rows)


def _targets_block(s: dict[str, Any]) -> str:
    rows = [[t.get("label"), t.get("url"), t.get("adapter"), t.get("kind"), _kv(t.get("labels")), _kv(t.get("identity")),
             fmt_num(t.get("cost_per_hour_usd"))] for t in s["targets"]]  # fmt: skip
    return table(["label", "url", "adapter", "kind", "labels", "identity", "$/hour"], rows, text_cols=(4, 5))


def _kv(d: Any) -> str:
    if not isinstance(d, dict):
        return "" if d is None else str(d)
    return ", ".join(f"{k}={v}" for k, v in d.items())


def _pretty(info: dict[str, Any]) -> str:
    return orjson.dumps(info, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()


# ---------------------------------------------------------------------------------------------- A/B


def render_compare_report(cmp: dict[str, Any]) -> str:
    """The HTML page of an A/B comparison dict."""
    out = [f"<h1>loadgen compare: {esc(cmp['a']['run_id'])} vs {esc(cmp['b']['run_id'])}</h1>",
           f'<p class="meta">{esc(cmp["pairing"])}; {cmp["n_boot"]:,} bootstrap resamples, {cmp["confidence"]:.0%} intervals; '
           f'significant: {esc(significance(cmp))}; verdicts at {esc(cmp.get("headline_stat", "p95"))}</p>']  # fmt: skip
    out += [f'<div class="banner warn">{esc(w)}</div>' for w in cmp["warnings"]]
    items = "".join(
        f"<li>{'<b>' if v['significant'] else ''}{esc(v['text'])}{'</b>' if v['significant'] else ''}</li>"
        for v in cmp["verdicts"]
    )
    out.append(section("verdicts", "Verdicts", f'<ul class="verdicts">{items}</ul>'))
    arms = [[name.upper(), arm["run_id"], arm["dir"], "partial" if arm["partial"] else "complete", f"{arm['requests']:,}",
             "; ".join(describe_target(t) for t in arm["targets"])]
            for name, arm in (("a", cmp["a"]), ("b", cmp["b"]))]  # fmt: skip
    out.append(
        section(
            "runs",
            "Runs and target identities",
            table(["", "run", "dir", "status", "requests", "targets"], arms, text_cols=(5,)),
        )
    )
    plots = [compare_cdf_svg(cmp, m, tc) for m, tc in HEADLINES]
    out.append(section("cdf", "Distributions (A solid, B dashed)", charts(*plots)))
    rows = [[r["metric"], r["turn_class"], r["stat"], fmt_ms(r["a"]), fmt_ms(r["b"]), fmt_ms(r["delta"]), _ci(r["delta_ci"], fmt_ms),
             _fx(r["ratio"]), _ci(r["ratio_ci"], _fx), _direction(r)]
            for r in cmp["rows"]]  # fmt: skip
    out.append(
        section(
            "table",
            "All statistics (ms)",
            table(
                ["metric", "turns", "stat", "A", "B", "B-A", "95% CI", "B/A", "95% CI", "significant"], rows
            ),
            '<p class="muted">Significant: B lower (better) or B higher (worse) than A; blank: no significant '
            "difference.</p>",
        )
    )
    ov = [[o["name"], fmt_num(o["a"]), fmt_num(o["b"]), _fx(o["ratio"])] for o in cmp["overview"]]
    out.append(section("overview", "Run figures", table(["figure", "A", "B", "B/A"], ov)))
    return page(f"loadgen compare: {cmp['a']['run_id']} vs {cmp['b']['run_id']}", out)


def _direction(row: dict[str, Any]) -> Raw:
    """A significant change of a latency, coloured by whether it is better (lower) or worse."""
    if row["significant"] is None:
        return ok_mark(None)
    if not row["significant"]:
        return Raw("")
    lower = (row["delta"] or 0) < 0
    return ok_mark(lower, "B lower", "B higher")


def _fx(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}\u00d7"


def _ci(pair: list[float] | None, f) -> str:
    return "-" if pair is None else f"[{f(pair[0])}, {f(pair[1])}]"


# ---------------------------------------------------------------------------------------------- sweep


def render_sweep_report(result: SweepResult) -> str:
    """The HTML page of a sweep: latency percentiles and goodput against the offered rate, and the answer.

    The rate is the session arrival rate (``--rate``); throughput and goodput are requests/s."""
    pts = [(p.rate_per_s, p.outcome, p.reasons, key_figures(p.summary)) for p in result.points]
    rates = [r for r, *_ in pts]
    if result.max_rate_per_s is None:
        answer = "none: the SLOs fail at every rate tried" if result.exit_code == 3 else "none judged"
    elif result.exit_code == 0:
        answer = f"{result.max_rate_per_s:g} sessions/s"
    else:  # the generator or an incomplete run bounds it: not the server's limit
        answer = f"at least {result.max_rate_per_s:g} sessions/s, inconclusive above"
    out = [f"<h1>loadgen sweep: max rate {esc(answer)}</h1>",
           f'<p class="meta">{esc(result.method)} over {len(pts)} runs; SLOs {esc(", ".join(result.slos))}</p>',
           f"<p>{esc(describe_max(result))}</p>"]  # fmt: skip
    out += [f'<div class="banner warn">{esc(n)}</div>' for n in result.notes]
    limit = [Mark(result.max_rate_per_s, "max rate", axis="x")] if result.max_rate_per_s is not None else []
    limits: dict[str, list[Mark]] = {}
    for slo in parse_slos(result.slos).percentile:
        limits.setdefault(slo.metric, []).append(Mark(slo.limit_ms, str(slo)))
    x_label = "sessions/s offered"
    plots = []
    for metric in metrics_for(SWEEP):
        cols = {
            k: [(f["latency_ms"].get(metric) or {}).get(k) for *_, f in pts] for k in ("p50", "p90", "p99")
        }
        if any(v is not None for c in cols.values() for v in c):
            plots.append(line_chart([Series(k, rates, v, markers=True) for k, v in cols.items()],
                                    title=f"{METRIC_NAMES[metric]} vs rate", x_label=x_label, y_label="ms",
                                    y_log=True, marks=[*limits.get(metric, []), *limit]))  # fmt: skip
    good = [Series("throughput", rates, [f["requests_per_s"] for *_, f in pts], markers=True),
            Series("goodput", rates, [f["goodput_requests_per_s"] for *_, f in pts], markers=True, dashed=True)]  # fmt: skip
    plots.append(line_chart(good, title="Throughput and goodput vs rate", x_label=x_label, y_label="requests/s",
                            y_min=0, marks=limit))  # fmt: skip
    priced = any(f["output_tokens_per_usd"] is not None for *_, f in pts)
    if priced:
        per_usd = [Series("output tokens/$", rates, [f["output_tokens_per_usd"] for *_, f in pts], markers=True),
                   Series("good output tokens/$", rates, [f["goodput_tokens_per_usd"] for *_, f in pts], markers=True,
                          dashed=True)]  # fmt: skip
        plots.append(line_chart(per_usd, title="Output tokens per dollar vs rate", x_label=x_label,
                                y_label="tokens/$", y_min=0, marks=limit))  # fmt: skip
    out.append(section("sweep-plots", "Latency and goodput against rate", charts(*plots)))
    head = ["rate/s", "holds", "ttft p99", "itl p99", "out tok/s", "goodput/s", "errors"]
    head += ["tokens/$"] if priced else []
    rows = []
    for r, outcome, why, f in pts:
        holds = HOLDS_WORDS[outcome]
        mark = (
            ok_mark(outcome == HOLDS, holds, holds)
            if outcome in (HOLDS, SLO_MISSED)
            else Raw(f'<span class="muted">{esc(holds)}</span>')
        )
        row = [f"{r:g}", mark, fmt_ms((f["latency_ms"].get("ttft") or {}).get("p99")),
               fmt_ms((f["latency_ms"].get("itl") or {}).get("p99")), fmt_num(f["output_tokens_per_s"], 1),
               fmt_num(f["goodput_requests_per_s"]), fmt_pct(f["error_rate"])]  # fmt: skip
        row += [fmt_num(f["output_tokens_per_usd"], 0)] if priced else []
        rows.append([*row, f.get("run_id") or "", "; ".join(why)])
    out.append(
        section("sweep-points", "Runs", table([*head, "run", "why not"], rows, text_cols=(len(head) + 1,)))
    )
    return page(f"loadgen sweep: {answer}", out)


__all__ = ["RUN_SECTIONS", "render_compare_report", "render_report", "render_sweep_report", "write_report"]
