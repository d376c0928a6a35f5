"""The "LLM" tabs in Locust's web UI and a chart page of live percentiles.

* Tabs through ``web_ui.template_args`` (``extended_tabs``, ``extended_tables``) with rows injected
  into ``/stats/requests`` (``extended_stats``), the mechanism Locust offers for this. The "LLM"
  tab is the matrix: TTFT, TTFOT, TPOT, ITL, E2E and schedule lag (the registry's live view, in
  its order) x turn class x p50/p90/p95/p99/p99.9, in ms with thousands separators. Locust's
  tables sort their rows by a ``name`` field by default: the rows have none, so they keep this
  order. The "LLM verdict" tab: the verdict so far (``verdict_so_far``: SLOs passing or failing,
  the generator's health), then throughput, sessions and requests, errors by category, goodput.
* ``/loadgen/charts``: p50/p95/p99 over time per metric (inline SVG, refreshed by the browser),
  built from the interval histograms the master already merges.
* ``/loadgen/live.json``: the same numbers as JSON.

Every route is behind ``auth_required_if_enabled``, so ``--web-login`` keeps protecting it.
Percentiles are computed at most once per second, never per request.
"""

from __future__ import annotations

import html
import time
from pathlib import Path
from typing import Any

import orjson

from analysis.hdr import percentile_values
from analysis.metric_registry import LIVE, metrics_for
from analysis.metric_registry import TURN_CLASSES as REGISTRY_TURN_CLASSES
from analysis.metric_registry import metric as registered_metric
from analysis.slo import parse_slos
from loadgen.live.live_charts import FORM_ORDER, UI_SCRIPT, banner_html, charts_html
from loadgen.live.snapshot import SnapshotSource
from loadgen.live.verdict_so_far import verdict_so_far

LIVE_METRICS = metrics_for(LIVE)
TURN_CLASSES = (None, *REGISTRY_TURN_CLASSES)  # None: all turns
LIVE_PERCENTILES = (50.0, 95.0, 99.0)  # the charts' lines, through analysis.hdr.percentile_values
TAB_PERCENTILES = (50.0, 90.0, 95.0, 99.0, 99.9)  # the LLM tab's columns


def _pct_key(p: float) -> str:
    """``p99_9_ms`` for 99.9: a JSON key (and a column key of Locust's table) per percentile."""
    return "p" + f"{p:g}".replace(".", "_") + "_ms"


def _fmt_ms(value_ms: float | None) -> str:
    """1234.5 -> "1,234.50"; None -> an en dash (no values yet)."""
    return "\u2013" if value_ms is None else f"{value_ms:,.2f}"


def _fmt_count(n: float) -> str:
    return f"{n:,}" if isinstance(n, int) else f"{n:,.1f}"
UI_SCRIPT_ROUTE = "/loadgen/ui.js"
LIVE_CHARTS_ROUTE = "/loadgen/live-charts"  # the LLM tab's banner and charts, as HTML in JSON
REPORT_ROUTE = "/loadgen/report"  # a finished run's report.html: /loadgen/report/<run id>, or the last
HISTORY_POINTS = 720  # 12 minutes at one point a second; older points are thinned


def _ms(value_us: float | None) -> float | None:
    return None if value_us is None else round(value_us / 1000.0, 2)


def _per_s(count: float, window_s: float) -> float:
    return round(count / window_s, 1) if window_s > 0 else 0.0


class LiveView:
    """Live numbers for the UI, from the run's merged histograms (cached for one second)."""

    def __init__(self, snapshot: SnapshotSource) -> None:
        self._snapshot = snapshot
        self._cache: tuple[float, dict[str, Any]] | None = None
        self.history: list[dict[str, Any]] = []
        self._reset_unix_s = 0.0  # rates count from the run's start or the last reset, if later
        self._coalescing: tuple[int, int] | None = None  # the workers' counts at the last history point
        # Finished runs of this process: run id -> (verdict line, exit code, report.html or None).
        self.finished: dict[str, tuple[str, int, Path | None]] = {}
        self.last_finished: str | None = None

    def run_ended(self, run_id: str, verdict_line: str, exit_code: int, report: Path | None) -> None:
        """A run reached its end: its verdict and report replace the verdict so far."""
        self.finished[run_id] = (verdict_line, exit_code, report)
        self.last_finished = run_id
        self.invalidate()

    def report_of(self, run_id: str | None) -> Path | None:
        """The report.html of a finished run of this process (the last one for None); never a path
        from the request itself."""
        entry = self.finished.get(run_id or self.last_finished or "")
        return entry[2] if entry is not None else None

    def invalidate(self) -> None:
        """Recompute at the next request: the run started or ended, or the numbers were reset."""
        self._cache = None

    def reset(self) -> None:
        """The UI's reset button: the next snapshot starts from zero (not from a cached one)."""
        self.start_over()
        self._reset_unix_s = time.time()

    def start_over(self) -> None:
        """A new run (or a reset): no cached snapshot, and charts without the earlier points."""
        self.invalidate()
        self.history = []
        self._reset_unix_s = 0.0
        self._coalescing = None

    def snapshot(self) -> dict[str, Any]:
        now = time.monotonic()
        if self._cache is not None and now - self._cache[0] < 1.0:
            return self._cache[1]
        snap = self._snapshot()
        agg = snap.aggregate
        rows = []  # numbers, for live.json's readers
        matrix = []  # the same as text, for the tab
        for name in LIVE_METRICS:
            m = registered_metric(name)
            if m.optional and not agg.combined(name).get_total_count():
                continue  # e.g. TTFOT without a reasoning model: no rows rather than empty ones
            for tc in TURN_CLASSES:
                h = agg.combined(name, tc)
                n = h.get_total_count()
                values = percentile_values(h, TAB_PERCENTILES)
                row: dict[str, Any] = {"name": name, "turn_class": tc or "all", "count": n}
                row.update({_pct_key(p): _ms(v) if n else None for p, v in zip(TAB_PERCENTILES, values, strict=True)})
                rows.append(row)
                cells = {"metric": m.title, "turns": tc or "all", "count": _fmt_count(n)}
                cells.update({_pct_key(p): _fmt_ms(row[_pct_key(p)]) for p in TAB_PERCENTILES})
                matrix.append(cells)
        t0 = snap.t0_unix_s
        # A finished run's clock stops at its end, so its rates stay what they were.
        end = snap.t_end_unix_s or time.time()
        elapsed = max(0.0, end - t0) if t0 else 0.0
        window = end - max(t0, self._reset_unix_s) if t0 else 0.0
        cfg = snap.config
        verdict = verdict_so_far(
            agg, cfg.slos if cfg else [], cfg.max_schedule_lag_us if cfg else 10_000, snap.coalescing
        )
        ended = self.finished.get(cfg.run_id) if cfg is not None and snap.t_end_unix_s else None
        if ended is not None:
            line, _code, report = ended
            run: list[tuple[str, Any]] = [("verdict", line.removeprefix("loadgen verdict: "))]
            run.append(("report", f"{REPORT_ROUTE}/{cfg.run_id}" if report is not None else "not written (see the log)"))
        else:
            run = [("verdict so far", verdict.text)]
        run += [(f"SLO {c.slo}", c.text()) for c in verdict.slos]
        run.append(("generator", verdict.generator.text()))
        run += [
            ("run", snap.config.run_id if snap.config else "-"),
            ("mode", snap.config.mode if snap.config else "-"),
            ("elapsed", f"{elapsed:.1f}s"),
            ("sessions planned", "-" if cfg is None else "unbounded (closed loop)" if snap.arrivals_planned is None else _fmt_count(snap.arrivals_planned)),
            ("sessions started", _fmt_count(snap.sessions_started)),
            ("sessions in flight", snap.sessions_in_flight),
            ("requests on the wire", snap.requests_in_flight),
            ("requests done", _fmt_count(agg.requests)),
            ("requests/s", _fmt_count(_per_s(agg.requests, window))),
            ("output tokens/s", _fmt_count(_per_s(agg.output_tokens, window))),
            ("input tokens/s", _fmt_count(_per_s(agg.prompt_tokens, window))),
            ("errors", _fmt_count(sum(agg.errors.values()))),
        ]
        run += [(f"errors: {k}", _fmt_count(v)) for k, v in sorted(agg.errors.items())]
        if agg.slo_total:
            # Per-request SLOs (--slo ttft=1s,...): goodput is the rate of requests meeting all.
            run.append(("SLO attainment", f"{100.0 * agg.slo_met / agg.slo_total:.1f}%"))
            run.append(("goodput (req/s)", _fmt_count(_per_s(agg.slo_met, window))))
        data = {
            "percentiles": rows,
            "matrix": matrix,
            "verdict": {"state": verdict.state, "exit_code": verdict.exit_code, "text": verdict.text},
            "final": None if ended is None else {"verdict": ended[0], "exit_code": ended[1],
                                                 "report": f"{REPORT_ROUTE}/{cfg.run_id}" if ended[2] else None},
            "run": [{"key": k, "value": str(v)} for k, v in run],
        }
        self._cache = (now, data)
        return data

    def record_history_point(self) -> None:
        """Called once per flush: p50/p95/p99 of the last interval per metric, over all turns and
        per turn class, and the share of coalesced reads over the interval."""
        snap = self._snapshot()
        agg = snap.aggregate
        point: dict[str, Any] = {"t": round(time.time() - snap.t0_unix_s, 1)}
        for metric, h in agg.last_interval_by_metric().items():
            if h.get_total_count():
                point[metric] = {"all": [_ms(v) for v in percentile_values(h, LIVE_PERCENTILES)]}
        for (metric, tc), h in agg.last_interval_by_turn_class().items():
            if h.get_total_count() and metric in point:
                point[metric][tc] = [_ms(v) for v in percentile_values(h, LIVE_PERCENTILES)]
        if snap.coalescing is not None:
            before = self._coalescing or (0, 0)
            coalesced, chunks = snap.coalescing[0] - before[0], snap.coalescing[1] - before[1]
            self._coalescing = snap.coalescing
            # A lost worker's counts leave the sum: that interval has no share rather than a false one.
            if chunks > 0 and coalesced >= 0:
                point["coalesced_share"] = round(coalesced / chunks, 4)
        self.history.append(point)
        if len(self.history) > HISTORY_POINTS:
            self.history = self.history[::2]

    def banner(self) -> str:
        """The LLM tab's first line: the verdict so far (the run's own once it ended) and the
        figures of the verdict tab one reads first."""
        snap = self.snapshot()
        rows = {r["key"]: r["value"] for r in snap["run"]}
        final = snap.get("final")
        if final is not None:
            text = final["verdict"].removeprefix("loadgen verdict: ")
            state = "passing" if final["exit_code"] == 0 else "failed"
        else:
            text, state = snap["verdict"]["text"], snap["verdict"]["state"]
        keys = ("requests/s", "output tokens/s", "input tokens/s", "sessions planned", "sessions started", "sessions in flight",
                "requests done", "requests on the wire", "errors", "SLO attainment", "goodput (req/s)")  # fmt: skip
        # Each percentile SLO passing or failing, and the generator's health, first: the verdict's parts.
        figures = [(k, v) for k, v in rows.items() if k.startswith("SLO ") or k == "generator"]
        figures += [(k, rows[k]) for k in keys if k in rows]
        figures += [(k.removeprefix("errors: "), v) for k, v in rows.items() if k.startswith("errors: ")]
        return banner_html(text, state, figures, final.get("report") if final is not None else None)

    def charts(self) -> str:
        """The tab's charts (``live_charts.charts_html``), with the run's percentile SLOs marked."""
        snap = self._snapshot()
        marks: dict[str, list[tuple[str, float]]] = {}
        for slo in parse_slos((snap.config.slos if snap.config else None) or None).percentile:
            marks.setdefault(slo.metric, []).append((str(slo), slo.limit_us / 1000.0))
        shown = [(n, registered_metric(n).title) for n in LIVE_METRICS]
        return charts_html(self.history, shown, marks)


def install_web_ui(environment: Any, snapshot: SnapshotSource) -> LiveView | None:
    """Add the LLM tabs and routes to Locust's web UI (None when it has none)."""
    web_ui = environment.web_ui
    if web_ui is None:
        return None
    from flask import Response, request

    view = LiveView(snapshot)
    web_ui.template_args["extended_tabs"] = [
        {"title": "LLM", "key": "llm"},
        {"title": "LLM verdict", "key": "llm-run"},
    ]
    web_ui.template_args["extended_tables"] = [
        {
            "key": "llm",
            "structure": [
                {"key": "metric", "title": "Metric"},
                {"key": "turns", "title": "Turns"},
                {"key": "count", "title": "Count"},
                *({"key": _pct_key(p), "title": f"p{p:g} (ms)"} for p in TAB_PERCENTILES),
            ],
        },
        {"key": "llm-run", "structure": [{"key": "key", "title": "Run so far"}, {"key": "value", "title": "Value"}]},
    ]
    web_ui.template_args["extended_csv_files"] = [
        {"href": "/loadgen/charts", "title": "LLM percentile charts (loadgen)"},
        {"href": REPORT_ROUTE, "title": "The last finished run's report (loadgen, HTML)"},
    ]

    script = (
        UI_SCRIPT.replace("LIVE_CHARTS_ROUTE", LIVE_CHARTS_ROUTE).replace("FORM_ORDER", orjson.dumps(FORM_ORDER).decode())
    ).encode()

    @web_ui.app.after_request
    def _extend_stats(response: Any) -> Any:
        if request.path == "/" and response.status_code == 200 and response.mimetype == "text/html":
            # The LLM tab's charts: a script of this process's own (no dependency fetched).
            page = response.get_data()
            if b"</body>" in page:
                response.set_data(page.replace(b"</body>", f'<script src="{UI_SCRIPT_ROUTE}"></script></body>'.encode(), 1))
            return response
        if request.path != "/stats/requests" or response.status_code != 200:
            return response
        snap = view.snapshot()
        body = orjson.loads(response.get_data())
        body["extended_stats"] = [
            {"key": "llm", "data": snap["matrix"]},
            {"key": "llm-run", "data": snap["run"]},
        ]
        response.set_data(orjson.dumps(body))
        return response

    @web_ui.app.route("/loadgen/live.json")
    @web_ui.auth_required_if_enabled
    def _live_json() -> Any:
        return Response(orjson.dumps({**view.snapshot(), "history": view.history}), mimetype="application/json")

    @web_ui.app.route(REPORT_ROUTE)
    @web_ui.app.route(f"{REPORT_ROUTE}/<run_id>")
    @web_ui.auth_required_if_enabled
    def _report(run_id: str | None = None) -> Any:
        path = view.report_of(run_id)
        if path is None or not path.is_file():
            return Response("no finished run of this process has that report yet\n", status=404, mimetype="text/plain")
        return Response(path.read_bytes(), mimetype="text/html")

    @web_ui.app.route(UI_SCRIPT_ROUTE)
    @web_ui.auth_required_if_enabled
    def _ui_script() -> Any:
        return Response(script, mimetype="text/javascript")

    @web_ui.app.route(LIVE_CHARTS_ROUTE)
    @web_ui.auth_required_if_enabled
    def _live_charts() -> Any:
        return Response(orjson.dumps({"banner": view.banner(), "charts": view.charts()}), mimetype="application/json")

    @web_ui.app.route("/loadgen/charts")
    @web_ui.auth_required_if_enabled
    def _charts() -> Any:
        return Response(render_charts_page(view.charts(), view.snapshot()), mimetype="text/html")

    return view


def render_charts_page(charts: str, snapshot: dict[str, Any]) -> str:
    """The charts and the run's figures as a page of their own (``/loadgen/charts``)."""
    run_rows = "".join(
        f"<tr><th>{html.escape(r['key'])}</th><td>{html.escape(r['value'])}</td></tr>" for r in snapshot["run"]
    )
    return (
        "<!doctype html><html><head><meta charset='utf-8'><meta http-equiv='refresh' content='5'>"
        "<title>loadgen: live LLM metrics</title><style>body{font-family:system-ui,sans-serif;margin:1.5em}"
        "figure{display:inline-block;margin:0 1em 1em 0}figcaption{font-weight:600}"
        "table{border-collapse:collapse}th,td{padding:2px 10px;text-align:left;border-bottom:1px solid #ddd}</style>"
        "</head><body><h1>loadgen: live LLM metrics</h1>"
        f"<table>{run_rows}</table>{charts}</body></html>"
    )


__all__ = ["LiveView", "install_web_ui", "render_charts_page"]
