"""The live charts of the LLM tab: one inline SVG per metric over the run's report intervals.

Each metric's chart draws the interval p50, p95 and p99 over all turns, the p95 of first and of
follow-up turns (dashed: the prefix cache's effect is their gap), and each percentile SLO on
that metric as a labelled line; a last chart draws the share of coalesced reads (two token
chunks in one receive: one stamp for both) against its bound. Axes carry time ticks (s since the
run's start) and value ticks (ms). The HTML is built here, from numbers only (every label
escaped), and put into the tab by ``UI_SCRIPT``, which the web UI's page loads from this
process: no script is fetched from anywhere else.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

from analysis.generator_health import COALESCED_BOUND

WIDTH, HEIGHT = 520, 220
PAD_L, PAD_R, PAD_T, PAD_B = 58, 12, 26, 30
# (label, history key, index of the percentile in the point's triple, colour, dashed)
LINES = (
    ("p50", "all", 0, "#2b7bb9", False),
    ("p95", "all", 1, "#e08a1e", False),
    ("p99", "all", 2, "#c0392b", False),
    ("p95 first", "first", 1, "#2e8b57", True),
    ("p95 follow-up", "follow-up", 1, "#7b4fb3", True),
)


def nice_ticks(top: float, count: int = 4) -> list[float]:
    """Round tick values from 0 to at least ``top``: steps of 1, 2 or 5 x 10^k."""
    if top <= 0:
        return [0.0, 1.0]
    raw = top / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    n = math.ceil(top / step - 1e-9)
    return [round(i * step, 10) for i in range(n + 1)]


def _fmt(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:g}"


def svg_chart(
    title: str,
    series: Sequence[tuple[str, str, bool, list[tuple[float, float]]]],
    marks: Sequence[tuple[str, float]] = (),
    unit: str = "ms",
) -> str:
    """A line chart: ``series`` of (label, colour, dashed, [(t s, value)]), ``marks`` horizontal
    lines (label, value), both axes ticked."""
    pts = [p for *_, line in series for p in line]
    if not pts:
        return (f'<figure class="loadgen-chart" data-metric="{html.escape(title)}"><figcaption>'
                f"{html.escape(title)}</figcaption><p>no data yet</p></figure>")  # fmt: skip
    x0, x1 = min(t for t, _ in pts), max(t for t, _ in pts)
    if x1 <= x0:
        x1 = x0 + 1.0
    y_ticks = nice_ticks(max([v for _, v in pts] + [v for _, v in marks]) * 1.05)
    y1 = y_ticks[-1]

    def sx(t: float) -> float:
        return PAD_L + (t - x0) / (x1 - x0) * (WIDTH - PAD_L - PAD_R)

    def sy(v: float) -> float:
        return HEIGHT - PAD_B - v / y1 * (HEIGHT - PAD_B - PAD_T)

    out = [f'<line x1="{PAD_L}" y1="{HEIGHT - PAD_B}" x2="{WIDTH - PAD_R}" y2="{HEIGHT - PAD_B}" stroke="#888"/>',
           f'<line x1="{PAD_L}" y1="{PAD_T}" x2="{PAD_L}" y2="{HEIGHT - PAD_B}" stroke="#888"/>']  # fmt: skip
    for v in y_ticks:
        y = sy(v)
        out.append(f'<line x1="{PAD_L - 4}" y1="{y:.1f}" x2="{WIDTH - PAD_R}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text class="ytick" x="{PAD_L - 6}" y="{y + 3:.1f}" font-size="10" text-anchor="end">{_fmt(v)}</text>')
    for t in nice_ticks(x1 - x0, 5):
        if x0 + t > x1 + 1e-9:
            break
        x = sx(x0 + t)
        out.append(f'<line x1="{x:.1f}" y1="{HEIGHT - PAD_B}" x2="{x:.1f}" y2="{HEIGHT - PAD_B + 4}" stroke="#888"/>')
        out.append(f'<text class="xtick" x="{x:.1f}" y="{HEIGHT - PAD_B + 15}" font-size="10" text-anchor="middle">{_fmt(x0 + t)}s</text>')
    out.append(f'<text x="4" y="{PAD_T - 10}" font-size="10">{html.escape(unit)}</text>')
    for label, v in marks:
        y = sy(v)
        out.append(f'<line class="slo" x1="{PAD_L}" y1="{y:.1f}" x2="{WIDTH - PAD_R}" y2="{y:.1f}" stroke="#555" '
                   f'stroke-dasharray="6 3"><title>{html.escape(label)}</title></line>')  # fmt: skip
        out.append(f'<text x="{WIDTH - PAD_R - 2}" y="{y - 3:.1f}" font-size="10" text-anchor="end">{html.escape(label)}</text>')
    legend_x = PAD_L
    for label, colour, dashed, line in series:
        if not line:
            continue
        dash = ' stroke-dasharray="4 3"' if dashed else ""
        points = " ".join(f"{sx(t):.1f},{sy(v):.1f}" for t, v in line)
        out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.6"{dash} points="{points}">'
                   f"<title>{html.escape(label)}</title></polyline>")  # fmt: skip
        out.append(f'<text x="{legend_x}" y="{PAD_T - 10}" fill="{colour}" font-size="10">{html.escape(label)}</text>')
        legend_x += 8 + 6 * len(label)
    return (
        f'<figure class="loadgen-chart" data-metric="{html.escape(title)}"><figcaption>{html.escape(title)}</figcaption>'
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" role="img">{"".join(out)}</svg></figure>'
    )


def metric_series(history: list[dict[str, Any]], metric: str) -> list[tuple[str, str, bool, list[tuple[float, float]]]]:
    """The lines of one metric's chart from the history points (``LiveView.record_history_point``)."""
    out = []
    for label, turns, i, colour, dashed in LINES:
        line = []
        for p in history:
            triple = (p.get(metric) or {}).get(turns)
            if triple and triple[i] is not None:
                line.append((p["t"], triple[i]))
        out.append((label, colour, dashed, line))
    return out


def charts_html(history: list[dict[str, Any]], metrics: Sequence[tuple[str, str]], slo_marks: dict[str, list[tuple[str, float]]]) -> str:
    """Every chart of the tab: ``metrics`` as (name, title), then the coalesced reads."""
    figures = [svg_chart(f"{title} (ms, per interval)", metric_series(history, name), slo_marks.get(name, ()))
               for name, title in metrics]  # fmt: skip
    share = [(p["t"], 100.0 * p["coalesced_share"]) for p in history if p.get("coalesced_share") is not None]
    figures.append(svg_chart("coalesced reads (% of token chunks, per interval)",
                             [("coalesced", "#c0392b", False, share)],
                             [(f"bound {100 * COALESCED_BOUND:g}%", 100.0 * COALESCED_BOUND)], unit="%"))  # fmt: skip
    style = "display:flex;flex-wrap:wrap;gap:4px 16px;align-items:flex-start"
    return f'<div id="loadgen-charts" class="loadgen-charts" style="{style}">{"".join(figures)}</div>'


# Loaded by the web UI's page (``webui.install_web_ui`` adds it): while the LLM tab is open, it
# fetches the banner and the charts every two seconds and shows them above and under the tab's
# table, so the tab is one view: where the run is heading, the matrix, the charts.
UI_SCRIPT = """
(function () {
  var box = null, banner = null;
  function tab() { return new URLSearchParams(window.location.search).get("tab"); }
  function place() {
    var table = document.querySelector("table");
    if (!table) { return null; }
    var host = table.closest(".MuiTableContainer-root") || table.parentElement;
    if (!box) {
      box = document.createElement("div");
      box.id = "loadgen-live-charts";
      box.style.cssText = "display:flex;flex-wrap:wrap;gap:12px;margin:16px 0;font-family:sans-serif";
      banner = document.createElement("div");
      banner.id = "loadgen-live-banner";
      banner.style.cssText = "margin:8px 0 12px;font-family:sans-serif;box-sizing:border-box;max-width:100%";
    }
    if (box.previousElementSibling !== host) { host.insertAdjacentElement("afterend", box); }
    if (banner.nextElementSibling !== host) { host.insertAdjacentElement("beforebegin", banner); }
    return box;
  }
  function refresh() {
    if (tab() !== "llm") {
      [box, banner].forEach(function (b) { if (b && b.parentElement) { b.remove(); } });
      return;
    }
    fetch("LIVE_CHARTS_ROUTE", {credentials: "same-origin"})
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (view) {
        if (view && place()) { banner.innerHTML = view.banner; box.innerHTML = view.charts; }
      })
      .catch(function () {});
  }
  // The start form: loadgen's options open and first, in the order a run is described; Locust's
  // user count and ramp-up hidden (a run's users are its worker processes; their values stay).
  var FIRST = FORM_ORDER;
  function tidyForm() {
    var users = document.querySelector('input[name="userCount"]');
    var form = users && users.closest("form");
    if (!form || form.dataset.loadgenTidied) { return; }
    form.dataset.loadgenTidied = "1";
    ["userCount", "spawnRate"].forEach(function (name) {
      var input = form.querySelector('input[name="' + name + '"]');
      var field = input && input.closest(".MuiFormControl-root");
      if (field) { field.style.display = "none"; field.dataset.loadgenHidden = name; }
    });
    form.querySelectorAll(".MuiAccordionSummary-root").forEach(function (button) {
      if (button.textContent.trim() !== "Custom parameters") { return; }
      var section = button.closest(".MuiAccordion-root");
      if (section) { section.style.order = "-1"; section.dataset.loadgenFirst = "1"; }
      if (button.getAttribute("aria-expanded") === "false") { button.click(); }
      var inputs = FIRST.map(function (n) { return section.querySelector('[name="' + n + '"]'); })
        .filter(function (x) { return x; });
      if (inputs.length < 2) { return; }
      var box = inputs[0].parentElement;
      while (box && !box.contains(inputs[1])) { box = box.parentElement; }
      if (!box) { return; }
      box.style.display = "flex";
      box.style.flexDirection = "column";
      Array.prototype.forEach.call(box.children, function (child) {
        var named = child.querySelector("[name]");
        var at = named ? FIRST.indexOf(named.getAttribute("name")) : -1;
        child.style.order = String(at < 0 ? FIRST.length : at);
        if (named) { child.dataset.loadgenOrder = child.style.order; }
      });
    });
  }
  setInterval(refresh, 2000);
  setInterval(tidyForm, 300);
  window.addEventListener("load", function () { refresh(); tidyForm(); });
  refresh();
})();
"""

# The banner's colours by the verdict so far's state (loadgen.live.verdict_so_far)
_STATE_COLOURS = {"passing": "#1e7e34", "waiting": "#6c757d"}


def banner_html(verdict_text: str, state: str, figures: Sequence[tuple[str, str]], report_href: str | None = None) -> str:
    """The line above the matrix: the verdict so far (or the run's own, once it ended) and the
    figures one looks at first, as (label, value) pairs; a link to the run's report once it has one."""
    colour = _STATE_COLOURS.get(state, "#b02a37")
    items = "".join(
        f'<span class="loadgen-figure" style="white-space:nowrap"><b>{html.escape(k)}</b> '
        f"{html.escape(v)}</span>"
        for k, v in figures
    )
    if report_href is not None:
        items += f'<a class="loadgen-report" href="{html.escape(report_href)}" target="_blank">the run\'s report</a>'
    return (
        f'<div class="loadgen-verdict" data-state="{html.escape(state)}" style="color:#fff;background:{colour};'
        f'padding:8px 12px;border-radius:4px;font-weight:600">{html.escape(verdict_text)}</div>'
        f'<div class="loadgen-figures" style="margin-top:8px;font-size:14px;display:flex;flex-wrap:wrap;gap:4px 18px;'
        f'max-width:100%">{items}</div>'
    )


# The start form's loadgen options, in this order first (the rest after, as Locust lists them).
FORM_ORDER = ("workload", "arrival", "rate", "concurrency", "duration", "num_sessions", "seed", "slo", "warmup")

__all__ = ["FORM_ORDER", "LINES", "UI_SCRIPT", "banner_html", "charts_html", "metric_series", "nice_ticks", "svg_chart"]
