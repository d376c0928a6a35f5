"""HTML reports: self-contained, every section present with its plots, partial runs marked."""

from __future__ import annotations

import shutil
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

import pytest

from analysis.compare import compare_runs
from analysis.records import REPORT_FILE
from analysis.report import (
    RUN_SECTIONS,
    render_compare_report,
    render_report,
    render_sweep_report,
    write_report,
)
from analysis.sweep import find_max_rate
from tests.fixtures.results.synth import write_run
from tests.fixtures.results.tiny import TINY_DIR, tiny_records
from tests.unit.test_analysis_sweep import SLOS, model

CHART_SECTIONS = {"ttft-cdf": 2, "itl-cdf": 2, "ttft-by-turn": 1, "over-time": 2, "in-flight": 1,
                  "latency-over-time": 1, "schedule-lag": 1, "errors": 1}  # fmt: skip


class _Page(HTMLParser):
    """Collects section ids, the svgs inside each, external references and scripts."""

    def __init__(self) -> None:
        super().__init__()
        self.sections: dict[str, int] = {}
        self.current: str | None = None
        self.external: list[str] = []
        self.scripts = 0
        self.banners: list[str] = []
        self._in_banner = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section":
            self.current = a.get("id")
            self.sections[self.current] = 0
        elif tag == "svg" and self.current:
            self.sections[self.current] += 1
        elif tag == "script":
            self.scripts += 1
        elif tag in ("link", "img", "iframe") or (a.get("src") or a.get("href", "")).startswith("http"):
            self.external.append(tag)
        if tag == "div" and "banner" in (a.get("class") or ""):
            self._in_banner = True
            self.banners.append("")

    def handle_endtag(self, tag):
        if tag == "section":
            self.current = None
        if tag == "div":
            self._in_banner = False

    def handle_data(self, data):
        if self._in_banner:
            self.banners[-1] += data


def _parse(html: str) -> _Page:
    p = _Page()
    p.feed(html)
    return p


def _check_svgs(html: str) -> None:
    """Every chart is well-formed XML (a broken SVG renders as nothing)."""
    start = 0
    while (i := html.find("<svg", start)) >= 0:
        j = html.index("</svg>", i) + len("</svg>")
        ET.fromstring(html[i:j])
        start = j


def test_run_report_has_every_section_and_plot():
    html = render_report(TINY_DIR)
    page = _parse(html)
    assert list(page.sections) == list(RUN_SECTIONS)
    for sec, n in CHART_SECTIONS.items():
        assert page.sections[sec] == n, (sec, page.sections[sec])
    assert page.scripts == 0 and page.external == []
    assert "<h1>loadgen report: tiny" in html and "complete" in html
    assert "m1" in html and "openai-chat" in html  # target identity and config
    _check_svgs(html)


def test_partial_run_is_marked(tmp_path):
    write_run(tmp_path, tiny_records(), status="running", duration_s=None, with_hlog=False)
    page = _parse(render_report(tmp_path))
    assert any(b.startswith("Partial run.") for b in page.banners), page.banners
    assert any("histograms rebuilt" in b for b in page.banners)
    assert page.sections["over-time"] == 2  # plots still drawn from the records


def test_write_report(tmp_path):
    shutil.copytree(TINY_DIR, tmp_path / "r")
    path = write_report(tmp_path / "r")
    assert path == tmp_path / "r" / REPORT_FILE and path.read_text().startswith("<!DOCTYPE html>")


def test_compare_report(tmp_path):
    a = shutil.copytree(TINY_DIR, tmp_path / "a")
    b = shutil.copytree(TINY_DIR, tmp_path / "b")
    html = render_compare_report(compare_runs(a, b, n_boot=100))
    page = _parse(html)
    assert set(page.sections) == {"verdicts", "runs", "cdf", "table", "overview"}
    assert page.sections["cdf"] == 6 and page.scripts == 0
    _check_svgs(html)


@pytest.mark.parametrize("hi", [100.0, 30.0])
def test_sweep_report(hi):
    html = render_sweep_report(find_max_rate(model, SLOS, 1.0, hi, steps=3))
    page = _parse(html)
    assert page.sections["sweep-plots"] == 3  # ttft and itl vs rate, goodput vs rate
    assert "max rate" in html
    _check_svgs(html)


def _tick_labels(svg: str) -> list[str]:
    return [el.text for el in ET.fromstring(svg).iter() if el.tag.endswith("text") and el.text]


@pytest.mark.parametrize(("lo", "hi"), [(15.0, 19.0), (210.0, 480.0), (1.2, 1.9), (7.0, 7.0)])
def test_a_narrow_log_axis_still_has_labelled_ticks(lo, hi):
    from analysis.svg import Series, line_chart

    svg = line_chart([Series("p99", [1, 2, 3], [lo, (lo + hi) / 2, hi])], title="t", x_label="x", y_label="ms", y_log=True)
    labels = [t for t in _tick_labels(svg) if t.replace(".", "").isdigit()]
    y_values = sorted({float(t) for t in labels} - {1.0, 2.0, 3.0})
    assert len(y_values) >= 3, labels
    assert y_values[0] <= lo and y_values[-1] >= hi


def test_sweep_report_names_the_rate_unit_the_run_and_the_cost():
    def priced(rate):
        s = model(rate)
        s["run_id"] = f"rate-{rate:g}"
        s["cost"] = {"cost_per_hour_usd": 3.6, "output_tokens_per_usd": s["throughput"]["output_tokens_per_s"] * 1000,
                     "goodput_tokens_per_usd": None}  # fmt: skip
        return s

    html = render_sweep_report(find_max_rate(priced, SLOS, 1.0, 100.0, steps=3))
    page = _parse(html)
    assert page.sections["sweep-plots"] == 4  # plus tokens per dollar against rate
    assert "sessions/s offered" in html and "rate-100" in html and "tokens/$" in html
    assert "max rate holding the SLOs: 38.125/s; there goodput 38.1 requests/s" in html
    assert "3,812,500 output tokens/$" in html
