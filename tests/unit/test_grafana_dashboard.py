"""k8s/grafana/loadgen-dashboard.json: valid JSON whose queries use what the endpoint really exports.

Every ``loadgen_*`` metric a query names, and every label it selects or groups by, is checked
against the text a real aggregate renders (parsed with prometheus_client), so renaming a metric
or a label without the dashboard fails here rather than as an empty panel.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from analysis.records import RequestRecord
from loadgen.config import RunConfig
from loadgen.engine.recorder import MetricsAggregate, Recorder
from loadgen.live.exposition import render
from loadgen.live.prometheus import EXPORTED_NAMES, collect
from loadgen.live.snapshot import RunSnapshot

DASHBOARD = Path(__file__).resolve().parents[2] / "k8s" / "grafana" / "loadgen-dashboard.json"
# Labels Prometheus adds to every scraped series.
TARGET_LABELS = {"instance", "job"}


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def _exprs(dashboard: dict) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def _exported_labels() -> dict[str, set[str]]:
    """Sample name -> label names, from the text of a small real run's aggregate."""
    recorder = Recorder()
    for i, ok in enumerate((True, True, False)):
        base = dict(
            request_id=f"r{i}", session_id="s", session_index=0, turn_index=i, turn_class="first" if i == 0 else "follow-up",
            tenant="default", target="sim", worker="w", t_sched_us=0, t_send_us=10, prompt_tokens=5,
        )  # fmt: skip
        if ok:
            rec = RequestRecord(status="ok", t_first_us=900, t_last_us=1500, t_end_us=1600, output_tokens=3, chunks=3, itl_us=[300, 300], **base)
        else:
            rec = RequestRecord(status="error", error_category="timeout", **base)
        recorder.record_request(rec)
    agg = MetricsAggregate()
    agg.merge(recorder.take_delta())
    rt = RunSnapshot(
        config=RunConfig(run_id="r", workload="tiny", rate_per_s=1.0), aggregate=agg, t0_unix_s=1.0,
        t_end_unix_s=None, sessions_started=1, sessions_in_flight=1, requests_in_flight=1,
        workers={"active": 1, "lost": 0, "standby": 0},
    )  # fmt: skip
    out: dict[str, set[str]] = {}
    for fam in text_string_to_metric_families(render(collect(rt))):
        for s in fam.samples:
            out.setdefault(s.name, set()).update(s.labels)
    return out


def test_dashboard_is_grafana_json_with_unique_panels(dashboard) -> None:
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    for panel in dashboard["panels"]:
        assert {"x", "y", "w", "h"} <= panel["gridPos"].keys()
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}" and panel["targets"]
    for expr in _exprs(dashboard):
        assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}"), expr
        assert set(re.findall(r"\$(\w+)", expr)) - {"__rate_interval"} <= variables, expr


def test_every_loadgen_metric_and_label_in_a_query_is_exported(dashboard) -> None:
    exported = _exported_labels()
    used = set()
    for expr in _exprs(dashboard):
        for name, selector in re.findall(r"\b(loadgen_\w+)(?:\{([^}]*)\})?", expr):
            assert name in exported, f"{name} is not exported (exported: {sorted(exported)})"
            used.add(re.sub(r"_(bucket|sum|count)$", "", name))
            labels = set(re.findall(r"(\w+)\s*=~?", selector or ""))
            assert labels <= exported[name] | TARGET_LABELS, (name, labels - exported[name])
        for names in re.findall(r"\bby \(([^)]*)\)", expr):
            grouped = {n.strip() for n in names.split(",")} - {"le"} - TARGET_LABELS
            inner = re.findall(r"\b(loadgen_\w+)", expr)
            if inner:
                assert all(grouped <= exported[n] for n in inner), (expr, grouped)
    assert used <= set(EXPORTED_NAMES)
    # The panels the dashboard exists for.
    for needed in (
        "loadgen_ttft_seconds", "loadgen_itl_seconds", "loadgen_tpot_seconds", "loadgen_e2e_seconds",
        "loadgen_requests_total", "loadgen_output_tokens_total", "loadgen_errors_total",
        "loadgen_sessions_in_flight", "loadgen_schedule_lag_seconds", "loadgen_run_info",
    ):  # fmt: skip
        assert needed in used, needed
    quantiles = " ".join(e for e in _exprs(dashboard) if e.startswith("histogram_quantile"))
    for metric in ("ttft", "itl", "tpot", "e2e"):
        assert f"loadgen_{metric}_seconds_bucket" in quantiles


def test_server_panels_sit_next_to_vllm_and_sglang(dashboard) -> None:
    exprs = " ".join(_exprs(dashboard))
    for name in (
        "vllm:time_to_first_token_seconds_bucket", "vllm:e2e_request_latency_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket", "vllm:generation_tokens_total",
        "sglang:time_to_first_token_seconds_bucket", "sglang:e2e_request_latency_seconds_bucket",
        "sglang:inter_token_latency_seconds_bucket", "sglang:generation_tokens_total",
    ):  # fmt: skip
        assert name in exprs, name
