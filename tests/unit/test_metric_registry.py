"""The metric registry is the one declaration: the docs' tables and every view are derived from it.

Each check runs both ways (a name in the docs the registry lacks, and one the docs lack), so a
metric added in one place and not the other fails here with its name.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from analysis import compare, records, sessions, slo, summary_format, sweep
from analysis.metric_registry import (
    AB,
    COMPARE,
    ERROR_CATEGORIES,
    ERROR_REGISTRY,
    FAULTS,
    LIVE,
    METRICS,
    PROMETHEUS,
    REGISTRY,
    SLO,
    STEP_KIND,
    SUMMARY_TABLE,
    SWEEP,
    VIEWS,
    error_categories_of,
    metric,
    metrics_for,
)
from loadgen.live import prometheus, webui

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _table_rows(text: str, header: str) -> list[list[str]]:
    """The cells of each row of the markdown table whose header line is ``header``."""
    lines = text.splitlines()
    at = lines.index(header)
    rows = []
    for line in lines[at + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split(" | ")])
    return rows


def _plain(formula: str) -> str:
    """The docs write a minus as U+2212; the registry in ASCII."""
    return formula.replace("\u2212", "-")


def _doc_metrics() -> dict[str, tuple[str, str, str]]:
    """name -> (title, unit, first code span of the definition) from docs/metrics.md."""
    text = (DOCS / "metrics.md").read_text(encoding="utf-8")
    out = {}
    for cells in _table_rows(text, "| metric | unit | definition | from |"):
        m = re.fullmatch(r"\*\*(.+)\*\* \(`([a-z0-9_]+)`\)", cells[0])
        assert m, f"docs/metrics.md: metric cell {cells[0]!r} is not '**Title** (`name`)'"
        code = re.search(r"`([^`]+)`", cells[2])
        out[m.group(2)] = (m.group(1), cells[1], _plain(code.group(1)) if code else "")
    return out


def test_docs_metric_table_is_the_registry_both_ways() -> None:
    docs = _doc_metrics()
    assert sorted(docs) == sorted(METRICS), "docs/metrics.md's metric table and the registry list different metrics"
    for m in REGISTRY:
        title, unit, formula = docs[m.name]
        assert title == m.title, f"{m.name}: docs title {title!r}, registry {m.title!r}"
        assert unit == m.summary_unit, f"{m.name}: docs unit {unit!r}, registry {m.summary_unit!r}"
        assert formula == m.formula, f"{m.name}: docs formula {formula!r}, registry {m.formula!r}"


def test_docs_error_table_is_the_registry_both_ways() -> None:
    text = (DOCS / "metrics.md").read_text(encoding="utf-8")
    rows = _table_rows(text, "| category | fault | definition |")
    docs = {cells[0].strip("`"): (cells[1], cells[2]) for cells in rows}
    assert list(docs) == list(ERROR_CATEGORIES), "docs/metrics.md's error table and the registry differ"
    for c in ERROR_REGISTRY:
        assert docs[c.name] == (c.fault, c.definition), c.name


def test_docs_prometheus_histograms_are_the_registry_both_ways() -> None:
    text = (DOCS / "prometheus.md").read_text(encoding="utf-8")
    rows = _table_rows(text, "| metric | type | labels | what |")
    documented = {cells[0].strip("`") for cells in rows if cells[1] == "histogram"}
    exported = {m.exported_as for m in REGISTRY if PROMETHEUS in m.views}
    assert documented == exported
    assert {cells[0].strip("`") for cells in rows} == set(prometheus.EXPORTED_NAMES)


def test_every_view_lists_registered_metrics_in_its_own_order() -> None:
    for view in VIEWS:
        names = metrics_for(view)
        assert names, f"view {view} shows no metric"
        assert len(set(names)) == len(names)
        assert set(names) <= set(METRICS)
    with pytest.raises(ValueError, match="unknown view"):
        metrics_for("table")


def test_the_views_read_the_registry() -> None:
    """Each consumer's list is the registry's view, not a copy that can drift."""
    assert records.METRICS == METRICS
    assert summary_format._TABLE_METRICS[: len(metrics_for(SUMMARY_TABLE))] == metrics_for(SUMMARY_TABLE)
    assert set(summary_format._TABLE_METRICS) == set(METRICS)
    assert metrics_for(SLO) == slo.PERCENTILE_METRICS
    assert metrics_for(COMPARE) == compare.METRICS
    assert tuple(m for m in metrics_for(COMPARE) if metric(m).optional) == compare.OPTIONAL_METRICS
    assert {m.name: m.title for m in REGISTRY} == compare.METRIC_NAMES
    assert metrics_for(STEP_KIND) == sessions.STEP_KIND_METRICS
    assert metrics_for(LIVE) == webui.LIVE_METRICS
    assert tuple(prometheus.HISTOGRAMS) == metrics_for(PROMETHEUS)
    for name, (exported, help_text) in prometheus.HISTOGRAMS.items():
        assert (exported, help_text) == (metric(name).exported_as, metric(name).definition)
    assert set(metrics_for(AB)) <= set(METRICS)
    figures = sweep.key_figures({"metrics": {m: {"p50": 1.0} for m in METRICS}})
    assert tuple(figures["latency_ms"]) == metrics_for(SWEEP)


def test_every_exported_metric_has_a_seconds_name_and_every_duration_a_unit() -> None:
    for m in REGISTRY:
        assert m.unit in ("µs", "tokens")
        if PROMETHEUS in m.views:
            assert m.exported_as and m.exported_as.startswith("loadgen_") and m.exported_as.endswith("_seconds")
            assert m.kind == "duration", f"{m.name}: only durations are exported as *_seconds histograms"


def test_error_categories_partition_by_fault() -> None:
    by_fault = [c for f in FAULTS for c in error_categories_of(f)]
    assert sorted(by_fault) == sorted(ERROR_CATEGORIES)
    with pytest.raises(ValueError, match="unknown fault"):
        error_categories_of("network")
