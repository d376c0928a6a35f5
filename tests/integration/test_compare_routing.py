"""`loadgen compare` and `loadgen gate` on real runs: round-robin vs cache-aware routing.

Two simulated H200 replicas behind the real sglang-router; four agents run the same 26 seeded
sessions back to back, once per policy, plus a second cache-aware run for an A/A check. Each session
opens with a large private context (1.5-2.5k tokens) and follows up with four small turns, so a
follow-up that lands on the replica that never saw the session prefills the whole context again:
round robin does that for about a fifth of the follow-ups, cache-aware routing almost never. The
104 follow-ups per run put 10 beyond p90, the highest percentile compare judges on them. Pauses
between turns (0.25-0.45 s) keep the replicas mostly idle, so that a follow-up's TTFT is its own
prefill rather than a wait behind another session's, which is what makes two runs of one
configuration differ in their tails.
"""

from __future__ import annotations

import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import orjson
import pytest

from .runs import loadgen
from .test_report_outputs import open_in_chromium, svgs_by_section

pytestmark = pytest.mark.slow

WORKLOAD = """\
name: prefix-agents
description: Sessions that open with a large private context, then short follow-ups.
system_prompt_tokens: 100
turns: 5
first_user_tokens: {dist: uniform, low: 1500, high: 2500}
user_tokens: {dist: uniform, low: 20, high: 60}
tool_turn_fraction: 0.5
tool_output_tokens: {dist: uniform, low: 100, high: 300}
output_tokens: 16
think_time: {dist: uniform, low: 100ms, high: 200ms}
"""
ARMS = {"rr": "sglang:round_robin", "ca": "sglang:cache_aware", "ca-again": "sglang:cache_aware"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("routing")
    spec = d / "prefix-agents.yaml"
    spec.write_text(WORKLOAD)
    out = {}
    for name, router in ARMS.items():
        r = loadgen(
            "run", "--replicas", "2", "--router", router, "--profile", "h200-llama3-8b-fp8",
            "--time-scale", "1", "--workload", str(spec), "--concurrency", "4", "--num-sessions", "26",
            "--seed", "7", "--results", str(d / "results"), "--run-id", name,
            # Five processes share two cores here; what is compared is paired by session, so a late
            # send is not what this test is about (the saturation check has its own tests).
            "--max-schedule-lag", "100ms",
        )  # fmt: skip
        assert r.returncode == 0, (name, r.stdout[-2000:], r.stderr[-3000:])
        out[name] = d / "results" / name
    return out


def _compare(*args: str):
    r = loadgen("compare", *map(str, args))
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def test_cache_aware_cuts_follow_up_ttft_significantly(runs, capsys):
    r = _compare(runs["rr"], runs["ca"], "--stat", "p90")
    out = r.stdout
    # both targets' identities: the router, its policy, the replicas and what the engine said
    assert re.search(r"^A: rr \(.*\), 130 requests  target sglang-round_robin http://127\.0\.0\.1:\d+ via "
                     r"sglang-router \S+ policy=round_robin over 2 sim replica\(s\) \[.*engine=sim", out, re.M), out
    assert re.search(r"^B: ca \(.*\), 130 requests  target sglang-cache_aware .* policy=cache_aware over 2 sim", out, re.M)
    assert "model=llama-3.1-8b-instruct-fp8" in out
    assert "paired by (session_id, turn_index) over 130 request pairs" in out
    verdict = next(line.strip() for line in out.splitlines() if "follow-up-turn p90 TTFT" in line)
    assert verdict.startswith("B cuts follow-up-turn p90 TTFT "), out

    cmp = orjson.loads(_compare(runs["rr"], runs["ca"], "--json").stdout)
    assert cmp["paired"] and cmp["min_effect"] == 0.05

    def row(stat):
        return next(x for x in cmp["rows"] if (x["metric"], x["turn_class"], x["stat"]) == ("ttft", "follow-up", stat))

    for stat in ("p90", "mean"):  # the whole interval below 1x, beyond the noise band
        assert row(stat)["significant"] and row(stat)["ratio_ci"][1] < 1 / 1.05, row(stat)
    # p95 of 104 follow-ups rests on 5 values: shown, not judged
    assert row("p95")["significant"] is None and row("p95")["tail"] == 5.2
    default = _compare(runs["rr"], runs["ca"]).stdout
    assert "follow-up-turn p95 TTFT: too few values beyond p95 to judge (5.2 of 104; p95 needs 200)" in default
    with capsys.disabled():
        m = row("mean")
        print(f"\n[compare rr vs ca] {verdict}; follow-up mean TTFT B/A {m['ratio']:.2f} {m['ratio_ci']}")


def test_two_runs_of_one_configuration_show_no_significant_difference_at_p50(runs, capsys):
    out = _compare(runs["ca"], runs["ca-again"], "--stat", "p50").stdout
    verdicts = [line.strip() for line in out.splitlines() if line.startswith("  ") and ": " in line]
    assert len(verdicts) == 6, out
    assert all("no significant difference" in v for v in verdicts), verdicts
    assert "verdicts at p50" in out
    with capsys.disabled():
        print("\n[compare ca vs ca again, p50] " + " | ".join(verdicts))


def test_the_gate_fails_a_real_regression_and_passes_noise(runs):
    worse = loadgen("gate", str(runs["rr"]), "--baseline", str(runs["ca"]),
                    "--max-regression", "ttft_p90@follow-up=10%", "--slo", "ttft_p99=5s")  # fmt: skip
    assert worse.returncode == 3, worse.stdout + worse.stderr
    lines = worse.stdout.splitlines()
    assert any(re.match(r"FAIL  ttft_p90@follow-up regressed: \S+ \[\S+, \S+\] of baseline, over the 1\.10" "\u00d7" r" allowed", x)
               for x in lines), worse.stdout  # fmt: skip
    assert lines[-1] == "loadgen gate: FAIL (exit 3): 1 of 4 checks failed"
    assert "pass  SLO ttft_p99=5s met" in worse.stdout

    better = loadgen("gate", str(runs["ca"]), "--baseline", str(runs["rr"]), "--max-regression", "ttft_p90@follow-up=10%")
    assert better.returncode == 0, better.stdout
    # A/A: the medians gated at 10%; noise alone fails nothing
    noise = loadgen("gate", str(runs["ca-again"]), "--baseline", str(runs["ca"]), "--max-regression",
                    "ttft_p50=10%,ttft_p50@follow-up=10%,tpot_p50=10%,itl_p50=10%,e2e_p50=10%")  # fmt: skip
    assert noise.returncode == 0, noise.stdout
    assert noise.stdout.splitlines()[-1] == "loadgen gate: PASS: 7 checks"
    # a p99 over 130 requests is never judged: the gate says so every time, not by chance
    tail = loadgen("gate", str(runs["ca-again"]), "--baseline", str(runs["ca"]), "--max-regression", "ttft_p99=10%")
    assert tail.returncode == 3
    assert "FAIL  ttft_p99: too few values beyond p99 to judge (1.3 of 130; p99 needs 1,000); gate a lower percentile or run longer" in tail.stdout


def test_markdown_json_svg_and_html_outputs(runs, tmp_path):
    md = _compare(runs["rr"], runs["ca"], "--md").stdout
    assert md.startswith("## loadgen compare\n") and "| metric | turns | stat | A | B |" in md
    assert "follow-up-turn p95 TTFT: too few values beyond p95" in md
    svg, html = tmp_path / "ttft.svg", tmp_path / "compare.html"
    r = _compare(runs["rr"], runs["ca"], "--svg", svg, "--svg-metric", "ttft@follow-up", "--html", html)
    assert f"svg: {svg}" in r.stdout and f"report: {html}" in r.stdout
    root = ET.fromstring(svg.read_text())
    assert root.tag.endswith("svg") and "TTFT CDF, follow-up turns" in svg.read_text()
    assert html.read_text().startswith("<!DOCTYPE html>")


@pytest.mark.browser
def test_the_compare_report_renders_in_chromium_with_every_plot(runs, tmp_path, chromium, artifacts_dir):
    html = tmp_path / "compare.html"
    _compare(runs["rr"], runs["ca"], "--stat", "p90", "--html", html)
    dom = open_in_chromium(chromium, html, artifacts_dir, "report-compare", height=2600)
    sections = svgs_by_section(dom)
    assert sections["cdf"] == 6 and {"verdicts", "runs", "table", "overview"} <= set(sections), sections
    assert "B cuts follow-up-turn p90 TTFT" in dom and "policy=cache_aware" in dom and "B lower" in dom


def test_runs_of_different_seeds_are_refused_unless_forced(runs, tmp_path):
    other = shutil.copytree(runs["ca"], tmp_path / "other-seed")
    info = orjson.loads((other / "run.json").read_bytes())
    (other / "run.json").write_bytes(orjson.dumps({**info, "seed": 8}))
    r = loadgen("compare", str(runs["rr"]), str(other))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("Error: ") and "differ in seed (7 vs 8)" in line and "force" in line
    forced = _compare(runs["rr"], other, "--force")
    assert "unpaired: forced across different seed (7 vs 8)" in forced.stdout
