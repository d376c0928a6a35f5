"""Locust's web UI with loadgen's LLM tab, in a real headless Chromium, behind --web-login.

Locust runs loadgen's locustfile (a master and one worker process) plus a small login setup of
the kind Locust documents for ``--web-login``. The run is started the way the UI's form starts
it (POST /swarm with loadgen's options), against a sim whose truth log shows the load. What the
browser renders is checked against the run's own files: the LLM tab's TTFT count and p50 are the
merged histograms of metrics.hlog.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
import requests

from analysis.hlog import merge, read_histograms
from analysis.records import parse_histogram_tag
from loadgen.commands.run import LOCUSTFILE
from tests.conftest import free_port

from .runs import records, sim, truth

pytestmark = pytest.mark.slow

USER, PASSWORD = "operator", "s3cret-for-tests"

# The pattern of Locust's documentation for --web-login: a user loader and a login form handler.
# GET is accepted too so that a headless browser can log in from its command line.
AUTH_LOCUSTFILE = f'''
import secrets

from flask import Blueprint, redirect, request
from flask_login import UserMixin, login_user
from locust import events


class Operator(UserMixin):
    def __init__(self, name):
        self.id = name


@events.init.add_listener
def _login(environment, **_kwargs):
    web_ui = environment.web_ui
    if web_ui is None:
        return
    web_ui.app.secret_key = secrets.token_hex(16)
    web_ui.login_manager.user_loader(Operator)
    web_ui.auth_args = {{"username_password_callback": "/login_submit"}}
    bp = Blueprint("test_login", __name__)

    @bp.route("/login_submit", methods=["GET", "POST"])
    def login_submit():
        if request.values.get("username") == {USER!r} and request.values.get("password") == {PASSWORD!r}:
            login_user(Operator(request.values["username"]))
            return redirect(request.values.get("next") or "/")
        return redirect("/login")

    web_ui.app.register_blueprint(bp)
'''


def _wait_for(predicate, timeout_s: float, what: str):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            value = predicate()
        except (requests.ConnectionError, FileNotFoundError):
            # A results directory exists a moment before its run.json is written.
            value = None
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _browser(chromium: list[str], *args: str) -> str:
    r = subprocess.run([*chromium, *args], capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def _rows(html: str) -> list[list[str]]:
    rows = []
    for tr in re.findall(r"<tr[^>]*>(.*?)</tr>", html, re.S):
        cells = [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", tr, re.S)]
        if cells:
            rows.append(cells)
    return rows


def _llm_rows(snapshot: dict) -> dict[tuple[str, str], dict]:
    return {(row["name"], row["turn_class"]): row for row in snapshot["percentiles"]}


def test_llm_tab_charts_login_and_reset_in_a_real_browser(tmp_path, chromium, artifacts_dir) -> None:
    auth = tmp_path / "login_locustfile.py"
    auth.write_text(AUTH_LOCUSTFILE)
    results = tmp_path / "results"
    web_port, master_port = free_port(), free_port()
    base = f"http://127.0.0.1:{web_port}"
    with sim(tmp_path, "--profile", "tiny", "--seed", "4") as (proc, truth_log):
        cmd = [
            sys.executable, "-m", "locust", "-f", f"{LOCUSTFILE},{auth}",
            "--web-host", "127.0.0.1", "--web-port", str(web_port), "--web-login",
            "--processes", "1", "--master-bind-host", "127.0.0.1", "--master-bind-port", str(master_port),
            "--master-host", "127.0.0.1", "--master-port", str(master_port),
            "--host", proc.url, "--results", str(results), "--loglevel", "WARNING",
        ]  # fmt: skip
        locust = subprocess.Popen(
            cmd,
            stdout=(tmp_path / "locust.log").open("wb"),
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            _wait_for(lambda: requests.get(f"{base}/login", timeout=5).status_code == 200, 60, "the web UI")

            # --web-login protects loadgen's routes and the reset button like Locust's own.
            for path in ("/loadgen/live.json", "/loadgen/charts", "/stats/requests", "/?tab=llm"):
                r = requests.get(base + path, allow_redirects=False, timeout=5)
                assert r.status_code in (302, 401), (path, r.status_code)
                assert "/login" in r.headers.get("Location", "/login"), path
            r = requests.post(f"{base}/stats/reset", allow_redirects=False, timeout=5)
            assert r.status_code in (302, 401)

            ui = requests.Session()
            r = ui.post(f"{base}/login_submit", data={"username": USER, "password": PASSWORD}, timeout=5)
            assert r.status_code == 200
            assert ui.get(f"{base}/loadgen/live.json", timeout=5).status_code == 200

            # The start form in a real browser: loadgen's options open and first, in the order a
            # run is described; Locust's user count and ramp-up hidden.
            login = f"{base}/login_submit?username={USER}&password={PASSWORD}&next="
            form_dom = _browser(chromium, "--virtual-time-budget=5000", "--dump-dom", login + "/")
            hidden = re.findall(r'data-loadgen-hidden="(\w+)"', form_dom)
            assert sorted(hidden) == ["spawnRate", "userCount"], form_dom[-3000:]
            assert 'data-loadgen-first="1"' in form_dom
            assert re.search(r'aria-expanded="true"[^>]*>\s*<span[^>]*>\s*<p[^>]*>Custom parameters', form_dom)
            orders = {m[1]: int(m[0]) for m in re.findall(r'data-loadgen-order="(\d+)".*?name="(\w+)"', form_dom)}
            assert orders["workload"] < orders["arrival"] < orders["rate"] < orders["duration"] < orders["seed"] < orders["slo"]
            assert orders["adapter"] > orders["slo"], orders
            _browser(
                chromium, "--virtual-time-budget=5000", "--window-size=1200,1500",
                f"--screenshot={artifacts_dir / 'webui-start-form.png'}", login + "/",
            )  # fmt: skip

            # Start the run as the form does: Locust's fields plus loadgen's options.
            form = {
                "user_count": "1", "spawn_rate": "1", "host": proc.url,
                "workload": "tiny", "rate": "20", "duration": "5s", "seed": "7", "run_id": "ui",
                "max_schedule_lag": "10s", "slo": "ttft=10s",
            }  # fmt: skip
            r = ui.post(f"{base}/swarm", data=form, timeout=10)
            assert r.json()["success"], r.text
            # While the run goes, the LLM tab is one view: where the run is heading, first, then the
            # matrix filling in.
            _wait_for(lambda: ui.get(f"{base}/loadgen/live.json", timeout=5).json()["verdict"]["state"] != "waiting", 30, "a first merged request")
            dom = _browser(chromium, "--virtual-time-budget=4000", "--dump-dom", login + "/%3Ftab%3Dllm")
            assert ui.get(f"{base}/stats/requests", timeout=5).json()["state"] != "stopped", "the run ended before the check"
            banner = re.search(r'class="loadgen-verdict" data-state="([^"]+)"[^>]*>([^<]+)<', dom)
            assert banner, dom[-3000:]
            # Passing, unless this (shared, busy) machine made the generator late or coalesce reads:
            # then it says so, as the final verdict would.
            assert (banner[1], banner[2].split(":")[0]) in (("passing", "passing so far"), ("generator saturated", "generator saturated so far")), banner.groups()
            assert dom.index('id="loadgen-live-banner"') < dom.index("<table")
            figures = dict(re.findall(r'class="loadgen-figure"[^>]*><b>([^<]+)</b> ([^<]+)<', dom))
            assert {"requests/s", "sessions planned", "sessions in flight", "requests on the wire", "errors"} <= set(figures), figures
            live_matrix = [c for c in _rows(dom) if len(c) == 8]
            assert live_matrix and live_matrix[0][:2] == ["TTFT", "all"] and int(live_matrix[0][2].replace(",", "")) > 0
            _wait_for(lambda: ui.get(f"{base}/stats/requests", timeout=5).json()["state"] == "stopped", 60, "the run's end")
            run_dir = results / "ui"
            _wait_for(lambda: orjson.loads((run_dir / "run.json").read_bytes()).get("status") == "complete", 30, "run.json")

            recs = records(run_dir)
            served = [t for rid, t in truth(truth_log).items() if rid.startswith("ui-")]
            assert len(recs) >= 20 and len(served) == len(recs)
            info = orjson.loads((run_dir / "run.json").read_bytes())
            assert info["config"]["seed"] == 7 and info["config"]["rate_per_s"] == 20.0

            # The ground truth for the tab: the run's merged TTFT histogram (all turn classes).
            ttft = merge(h for tag, h in read_histograms(run_dir / "metrics.hlog").items() if parse_histogram_tag(tag)[0] == "ttft")
            n_ok = sum(1 for rec in recs if rec.ok)
            assert ttft.get_total_count() == n_ok
            p50_ms = round(ttft.get_value_at_percentile(50) / 1000.0, 2)

            # run.json is complete a moment before the verdict and the report are.
            _wait_for(lambda: ui.get(f"{base}/loadgen/live.json", timeout=5).json()["final"], 30, "the verdict")
            live = ui.get(f"{base}/loadgen/live.json", timeout=5).json()
            assert _llm_rows(live)[("ttft", "all")]["count"] == n_ok
            # The run is over: its elapsed time and rates stay put.
            run_tab = {row["key"]: row["value"] for row in live["run"]}
            time.sleep(1.2)
            again = {row["key"]: row["value"] for row in ui.get(f"{base}/loadgen/live.json", timeout=5).json()["run"]}
            assert again["elapsed"] == run_tab["elapsed"] and again["requests/s"] == run_tab["requests/s"]
            # Every request met the per-request SLO (ttft <= 10 s): goodput is the request rate.
            assert run_tab["requests done"] == f"{len(recs):,}" and n_ok == len(recs)
            # Ended: the run's own verdict and its report replace the verdict so far.
            assert run_tab["report"] == "/loadgen/report/ui" and live["final"]["report"] == "/loadgen/report/ui"
            assert run_tab["verdict"] == live["final"]["verdict"].removeprefix("loadgen verdict: ")
            report = ui.get(f"{base}/loadgen/report/ui", timeout=10)
            assert report.status_code == 200 and report.content == (run_dir / "report.html").read_bytes()
            if live["verdict"]["state"] == "passing":
                assert live["verdict"] == {"state": "passing", "exit_code": 0, "text": f"passing so far: {len(recs):,} requests, no failures"}
            else:
                assert live["verdict"]["state"] == "generator saturated" and live["verdict"]["exit_code"] == 4, live["verdict"]
            assert run_tab["SLO attainment"] == "100.0%"
            assert run_tab["goodput (req/s)"] == run_tab["requests/s"] and float(run_tab["requests/s"].replace(",", "")) > 0

            # The LLM tab in a real browser: the matrix Locust's UI renders from /stats/requests,
            # in the registry's order (not sorted by name), with every percentile column.
            dom = _browser(chromium, "--virtual-time-budget=8000", "--dump-dom", login + "/%3Ftab%3Dllm")
            headers = [re.sub(r"<[^>]+>", "", h).strip() for h in re.findall(r"<th[^>]*>(.*?)</th>", dom, re.S)]
            assert headers[:8] == ["Metric", "Turns", "Count", "p50 (ms)", "p90 (ms)", "p95 (ms)", "p99 (ms)", "p99.9 (ms)"], headers
            matrix = [c for c in _rows(dom) if len(c) == 8]
            rows = {(c[0], c[1]): c for c in matrix}
            assert ("TTFT", "all") in rows, dom[-3000:]
            assert rows[("TTFT", "all")][2] == f"{n_ok:,}"
            assert rows[("TTFT", "all")][3] == f"{p50_ms:,.2f}"
            titles = ["TTFT", "TTFOT", "TPOT", "ITL", "E2E latency", "schedule lag"]
            assert [c[0] for c in matrix if c[1] == "all"] == titles
            for title in titles:
                for tc in ("all", "first", "follow-up"):
                    assert all(re.fullmatch(r"\d{1,3}(,\d{3})*(\.\d\d)?", v) for v in rows[(title, tc)][2:]), rows[(title, tc)]
            _browser(
                chromium, "--virtual-time-budget=8000", "--window-size=1400,1000",
                f"--screenshot={artifacts_dir / 'webui-llm-tab.png'}", login + "/%3Ftab%3Dllm",
            )  # fmt: skip
            assert (artifacts_dir / "webui-llm-tab.png").stat().st_size > 10_000
            _browser(
                chromium, "--virtual-time-budget=8000", "--window-size=1400,900",
                f"--screenshot={artifacts_dir / 'webui-llm-verdict-tab.png'}", login + "/%3Ftab%3Dllm-run",
            )  # fmt: skip
            assert (artifacts_dir / "webui-llm-verdict-tab.png").stat().st_size > 10_000
            ended = {c[0]: c[1] for c in _rows(_browser(chromium, "--virtual-time-budget=4000", "--dump-dom", login + "/%3Ftab%3Dllm-run")) if len(c) == 2}
            assert ended["report"] == "/loadgen/report/ui" and ended["verdict"] == run_tab["verdict"], ended
            assert ended["generator"].startswith(("healthy: ", "saturated: ")), ended
            tab = _browser(chromium, "--virtual-time-budget=4000", "--dump-dom", login + "/%3Ftab%3Dllm")
            assert re.search(r'<a class="loadgen-report" href="/loadgen/report/ui"', tab), tab[-3000:]
            assert int(ended["sessions planned"].replace(",", "")) == int(ended["sessions started"].replace(",", "")) > 0, ended

            # The LLM tab's own charts, under its matrix (the page loads loadgen's script, which
            # fetches them): one per metric with p50/p95/p99 and the turn classes' p95 over the
            # run's intervals, ticked axes, and the coalesced reads against their bound.
            from loadgen.live.webui import LIVE_METRICS

            assert 'id="loadgen-live-charts"' in dom, dom[-3000:]
            tab_charts = dom[dom.index('id="loadgen-live-charts"'):]
            assert tab_charts.count("<svg") == len(LIVE_METRICS) + 1
            assert tab_charts.count('class="xtick"') >= 2 * len(LIVE_METRICS) and 'class="ytick"' in tab_charts
            assert "p95 first" in tab_charts and "p95 follow-up" in tab_charts
            _browser(
                chromium, "--virtual-time-budget=8000", "--window-size=1400,2300",
                f"--screenshot={artifacts_dir / 'webui-llm-charts.png'}", login + "/%3Ftab%3Dllm",
            )  # fmt: skip
            # The same charts on a page of their own.
            charts = _browser(chromium, "--virtual-time-budget=3000", "--dump-dom", login + "/loadgen/charts")
            assert charts.count("<svg") == len(LIVE_METRICS) + 1
            lines = re.findall(r'<polyline[^>]* points="([^"]+)"', charts)
            assert len(lines) >= 3 * len(LIVE_METRICS)
            assert sum(len(pts.split()) >= 2 for pts in lines) >= 3 * len(LIVE_METRICS), lines

            # A second run from the form (the UI's "new" button): its own results directory, and
            # the live numbers and charts start over with it.
            r = ui.post(f"{base}/swarm", data={**form, "duration": "1s"}, timeout=10)
            assert r.json()["success"], r.text
            [second] = _wait_for(lambda: [d for d in results.iterdir() if d.name.startswith("ui-")], 30, "the second run")
            _wait_for(lambda: orjson.loads((second / "run.json").read_bytes()).get("status") == "complete", 60, "its end")
            live = ui.get(f"{base}/loadgen/live.json", timeout=5).json()
            assert _llm_rows(live)[("ttft", "all")]["count"] == len(records(second))
            # At least one point (the run lasts 2 s from its start, points come every second),
            # and none left from the first run, whose times would run backwards into these.
            times = [p["t"] for p in live["history"]]
            assert times and times == sorted(times), times

            # The UI's reset button resets loadgen's live numbers too, at once.
            assert ui.post(f"{base}/stats/reset", timeout=5).text == "ok"
            live = ui.get(f"{base}/loadgen/live.json", timeout=5).json()
            assert all(row["count"] == 0 for row in live["percentiles"]), live["percentiles"][:3]
            assert live["history"] == []
            stats = ui.get(f"{base}/stats/requests", timeout=5).json()
            llm = next(t["data"] for t in stats["extended_stats"] if t["key"] == "llm")
            assert llm and all(row["count"] == "0" for row in llm)
            # The results on disk keep everything.
            assert len(records(run_dir)) == len(recs)
        finally:
            locust.terminate()
            try:
                locust.wait(timeout=20)
            except subprocess.TimeoutExpired:
                locust.kill()
                locust.wait(timeout=10)
    log = Path(tmp_path / "locust.log").read_text()
    assert "Traceback" not in log, log[-3000:]
