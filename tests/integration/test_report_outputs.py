"""What a real run leaves behind, read back: cost, metrics.hlog, CSV, the HTML report, bad input.

One short run on the embedded sim (tiny profile, 2 s of load) serves every test here; another
against a sim we start ourselves takes its target, label, hardware and cost from a target file.
Errors are checked through the CLI as a subprocess: one line, exit 2, never a traceback.
"""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
from pathlib import Path

import orjson
import pytest
from hdrh.histogram import HdrHistogram
from hdrh.log import HistogramLogReader

from analysis.hlog import read_histograms
from analysis.records import parse_histogram_tag

from .runs import loadgen, records, sim

RUN_SECTIONS_WITH_PLOTS = ("ttft-cdf", "itl-cdf", "ttft-by-turn", "over-time", "in-flight", "latency-over-time",
                           "schedule-lag")  # fmt: skip


@pytest.fixture(scope="module")
def costed_run(tmp_path_factory) -> Path:
    """A complete run priced with --cost-per-hour, with a per-request SLO so goodput is defined."""
    results = tmp_path_factory.mktemp("costed")
    r = loadgen(
        "run", "--workload", "tiny", "--profile", "tiny", "--time-scale", "5", "--rate", "8",
        "--duration", "2s", "--seed", "11", "--cost-per-hour", "2.5", "--slo", "ttft_p99=1s,ttft=500ms",
        "--results", str(results), "--run-id", "costed", "--html",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    return results / "costed"


def _summary(run_dir: Path) -> dict:
    return orjson.loads((run_dir / "summary.json").read_bytes())


def test_cost_per_hour_flows_to_the_summary(costed_run):
    s = _summary(costed_run)
    info = orjson.loads((costed_run / "run.json").read_bytes())
    assert info["targets"][0]["cost_per_hour_usd"] == 2.5
    cost = s["cost"]
    out_tps = s["throughput"]["output_tokens_per_s"]
    assert out_tps > 0 and cost["cost_per_hour_usd"] == 2.5
    assert cost["output_tokens_per_usd"] == pytest.approx(out_tps / (2.5 / 3600), rel=1e-3)
    assert cost["usd_per_1m_output_tokens"] == pytest.approx(2.5 / 3600 / out_tps * 1e6, rel=1e-3)
    good_tps = s["slo"]["goodput_tokens_per_s"]
    assert cost["goodput_tokens_per_usd"] == pytest.approx(good_tps / (2.5 / 3600), rel=1e-3)
    (target,) = s["by_target"].values()
    assert target["cost"]["cost_per_hour_usd"] == 2.5


def test_a_target_files_cost_label_and_hardware_reach_the_summary(tmp_path):
    with sim(tmp_path, "--profile", "tiny", "--time-scale", "5", "--seed", "2") as (proc, _):
        target = tmp_path / "target.yaml"
        target.write_text(
            f"url: {proc.url}\nlabel: sim-a\ncost_per_hour: 4.0\nlabels: {{hardware: sim-cpu, model: tiny}}\n"
        )
        r = loadgen(
            "run", "--target-file", str(target), "--workload", "tiny", "--rate", "8", "--duration", "1s",
            "--seed", "2", "--results", str(tmp_path / "results"), "--run-id", "from-file",
        )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    s = _summary(tmp_path / "results" / "from-file")
    assert s["targets"][0]["label"] == "sim-a" and s["targets"][0]["cost_per_hour_usd"] == 4.0
    out_tps = s["throughput"]["output_tokens_per_s"]
    assert s["cost"]["output_tokens_per_usd"] == pytest.approx(out_tps / (4.0 / 3600), rel=1e-3)
    assert s["by_target"]["sim-a"]["cost"]["cost_per_hour_usd"] == 4.0
    assert s["by_hardware"]["sim-cpu"]["cost"]["cost_per_hour_usd"] == 4.0


def test_metrics_hlog_reads_with_hdrhs_own_reader(costed_run):
    reader = HistogramLogReader(str(costed_run / "metrics.hlog"), HdrHistogram(1, 3_600_000_000, 3))
    totals: dict[str, int] = {}
    intervals = 0
    while (h := reader.get_next_interval_histogram()) is not None:
        intervals += 1
        totals[h.get_tag()] = totals.get(h.get_tag(), 0) + h.get_total_count()
    assert intervals >= 2
    ours = read_histograms(costed_run / "metrics.hlog")
    assert totals == {tag: h.get_total_count() for tag, h in ours.items()}
    recs = records(costed_run)
    ttft = sum(n for tag, n in totals.items() if parse_histogram_tag(tag)[0] == "ttft")
    lag = sum(n for tag, n in totals.items() if parse_histogram_tag(tag)[0] == "schedule_lag")
    assert ttft == sum(r.ok for r in recs) and lag == len(recs) and ttft > 0


def test_report_writes_csv_and_html(costed_run, tmp_path):
    run_dir = shutil.copytree(costed_run, tmp_path / "copy")
    (run_dir / "report.html").unlink()
    out = tmp_path / "summary.csv"
    r = loadgen("report", str(run_dir), "--csv", str(out), "--html")
    assert r.returncode == 0, r.stderr
    assert f"csv: {out}" in r.stdout and "report.html" in r.stdout
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert list(rows[0]) == ["scope", "group", "metric", "stat", "value", "unit"]
    cell = {(x["scope"], x["group"], x["metric"], x["stat"]): x for x in rows}
    s = _summary(run_dir)
    assert float(cell[("all", "", "ttft", "p99")]["value"]) == pytest.approx(s["metrics"]["ttft"]["p99"])
    assert cell[("all", "", "cost", "output_tokens_per_usd")]["unit"] == "output_tokens"
    assert float(cell[("all", "", "cost", "cost_per_hour_usd")]["value"]) == 2.5
    assert (run_dir / "report.html").read_text().startswith("<!DOCTYPE html>")


# ---------------------------------------------------------------------------------------------- bad input


def _damaged(costed_run: Path, tmp_path: Path, how: str) -> Path:
    d = shutil.copytree(costed_run, tmp_path / how)
    run_json, requests = d / "run.json", d / "requests.jsonl"
    if how == "no-run-json":
        run_json.unlink()
    elif how == "truncated-run-json":
        run_json.write_bytes(run_json.read_bytes()[: len(run_json.read_bytes()) // 2])
    elif how == "newer-schema":
        info = orjson.loads(run_json.read_bytes())
        run_json.write_bytes(orjson.dumps({**info, "schema_version": 99}))
    elif how == "no-requests":
        requests.unlink()
    elif how == "no-hlog":
        (d / "metrics.hlog").unlink()
    elif how == "damaged-requests":  # a line in the middle cut short: not what a crash leaves
        lines = requests.read_bytes().splitlines(keepends=True)
        lines[len(lines) // 2] = lines[len(lines) // 2][:40] + b"\n"
        requests.write_bytes(b"".join(lines))
    return d


BAD = {
    "no-run-json": r"run\.json: no such file; is .*no-run-json a loadgen results directory\?",
    "truncated-run-json": r"run\.json: not valid JSON \(.*\); the file is damaged",
    "newer-schema": r"run\.json: schema_version 99 is newer than this loadgen understands \(1\); upgrade loadgen",
    "no-requests": r"requests\.jsonl: no such file, but run\.json says the run completed; the directory is incomplete",
    "no-hlog": r"metrics\.hlog: no such file, but run\.json says the run completed; the directory is incomplete",
    "damaged-requests": r"requests\.jsonl line \d+: not a JSON record; the file is corrupt",
}


def _one_line_error(r: subprocess.CompletedProcess, pattern: str) -> None:
    import re

    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), r.stderr
    assert re.search(pattern, lines[0]), lines[0]


@pytest.mark.parametrize("how", sorted(BAD))
def test_a_bad_results_directory_is_one_line_and_exit_2(costed_run, tmp_path, how):
    bad = _damaged(costed_run, tmp_path, how)
    _one_line_error(loadgen("report", str(bad)), BAD[how])
    # compare and gate read the same files and say the same
    _one_line_error(loadgen("compare", str(costed_run), str(bad), "--n-boot", "100"), BAD[how])
    if how in ("newer-schema", "truncated-run-json"):
        _one_line_error(loadgen("gate", str(bad), "--baseline", str(costed_run), "--max-regression",
                                "ttft_p99=10%", "--n-boot", "100"), BAD[how])  # fmt: skip


def test_a_last_line_cut_by_a_crash_is_dropped_and_said(costed_run, tmp_path):
    d = shutil.copytree(costed_run, tmp_path / "cut")
    data = (d / "requests.jsonl").read_bytes()
    (d / "requests.jsonl").write_bytes(data[: len(data) - 30])  # the writer died mid-line
    r = loadgen("report", str(d))
    assert r.returncode == 0, r.stderr
    assert "requests.jsonl: last line" in r.stdout and "the run was cut short" in r.stdout


def test_missing_directories_and_bad_flags_are_one_line(costed_run, tmp_path):
    _one_line_error(loadgen("compare", str(costed_run), str(tmp_path / "nope")), r"nope: no such results directory")
    _one_line_error(loadgen("gate", str(costed_run), "--max-regression", "ttft_p99=10%"),
                    r"--max-regression needs --baseline DIR")  # fmt: skip
    _one_line_error(loadgen("gate", str(costed_run), "--baseline", str(costed_run), "--max-regression", "ttft_p99=lots"),
                    r"--max-regression: ttft_p99: 'lots' is not a tolerance; use e\.g\. 0\.10 or 10%")  # fmt: skip
    _one_line_error(loadgen("compare", str(costed_run), str(costed_run), "--md", "--json"), r"give one of --md and --json")


# ---------------------------------------------------------------------------------------------- browser


def open_in_chromium(chromium: list[str], page: Path, artifacts_dir: Path, name: str, *, height: int = 3000) -> str:
    """Load ``page`` in headless Chromium; fail on any console message; save a full screenshot to
    ``artifacts_dir/<name>.png``; return the DOM Chromium built."""
    url = page.resolve().as_uri()
    dom = subprocess.run([*chromium, "--enable-logging=stderr", "--v=0", "--dump-dom", url],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert dom.returncode == 0, dom.stderr[-2000:]
    console = [line for line in dom.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], console
    assert "<html" in dom.stdout[:200] and dom.stdout.rstrip().endswith("</html>")
    shot = artifacts_dir / f"{name}.png"
    shot.unlink(missing_ok=True)
    r = subprocess.run([*chromium, f"--screenshot={shot}", f"--window-size=1280,{height}", "--hide-scrollbars", url],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0 and shot.exists() and shot.stat().st_size > 20_000, r.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return dom.stdout


def svgs_by_section(dom: str) -> dict[str, int]:
    """``{section id: number of <svg> charts inside it}`` from a DOM (Chromium's serialisation)."""
    from html.parser import HTMLParser

    class Sections(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.found: dict[str, int] = {}
            self.current: str | None = None

        def handle_starttag(self, tag, attrs):
            if tag == "section":
                self.current = dict(attrs).get("id")
                self.found[self.current] = 0
            elif tag == "svg" and self.current:
                self.found[self.current] += 1

        def handle_endtag(self, tag):
            if tag == "section":
                self.current = None

    p = Sections()
    p.feed(dom)
    return p.found


@pytest.mark.browser
def test_the_run_report_renders_in_chromium_with_every_plot(costed_run, chromium, artifacts_dir):
    dom = open_in_chromium(chromium, costed_run / "report.html", artifacts_dir, "report-run", height=5200)
    sections = svgs_by_section(dom)
    for sec in RUN_SECTIONS_WITH_PLOTS:
        assert sections.get(sec, 0) >= 1, (sec, sections)
    assert sections["ttft-cdf"] == 2 and sections["itl-cdf"] == 2
    assert "<script" not in dom and "costed" in dom and "complete" in dom
    assert "output tokens/$" in dom  # the cost row of the throughput section
