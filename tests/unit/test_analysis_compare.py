"""A/B comparison: pairing, verdicts, refusal of incomparable runs, formatters."""

from __future__ import annotations

import shutil
import xml.etree.ElementTree as ET

import numpy as np
import orjson
import pytest

from analysis.compare import compare_runs, find_row
from analysis.compare_format import compare_cdf_svg, compare_to_json, compare_to_markdown, format_compare
from analysis.errors import ResultsError
from analysis.summary import summarize
from tests.fixtures.results.synth import record, write_run

N_BOOT = 400


def _records(*, follow_up_factor=1.0, itl_factor=1.0, noise_seed=0, sessions=120):
    """Sessions with their own base latency (what pairing cancels) and a little per-run noise."""
    base_rng = np.random.default_rng(42)  # the same sessions in every run
    noise = np.random.default_rng(noise_seed)
    out = []
    for s in range(sessions):
        base = base_rng.lognormal(5, 0.6)
        gaps = base_rng.lognormal(3, 0.3, 10)
        for t in range(3):
            f = 1.0 if t == 0 else 0.6 * follow_up_factor
            ttft = base * f * np.exp(0.05 * noise.standard_normal())
            itl = list(gaps * itl_factor * np.exp(0.05 * noise.standard_normal(10)))
            out.append(record(s, t, sched_ms=s * 100 + t * 3000, ttft_ms=ttft, itl_ms=itl, tokens=11))
    return out


def _targets(engine: str):
    return [{"label": "t", "url": f"http://{engine}:8000", "identity": {"engine": engine, "build": "b1"}}]


@pytest.fixture
def run_a(tmp_path):
    return write_run(tmp_path / "a", _records(), run_id="a", duration_s=20, targets=_targets("old"))


def test_identical_runs_show_no_difference(tmp_path, run_a):
    run_b = shutil.copytree(run_a, tmp_path / "b")
    cmp = compare_runs(run_a, run_b, n_boot=N_BOOT)
    assert cmp["paired"] and "paired by (session_id, turn_index) over 360" in cmp["pairing"]
    judged = [v for v in cmp["verdicts"] if v["significant"] is not None]
    assert len(judged) == 5 and all("no significant difference" in v["text"] for v in judged), cmp["verdicts"]
    # 120 first turns put 6 values beyond p95: shown, not judged
    (first,) = [v for v in cmp["verdicts"] if v["significant"] is None]
    assert (
        first["text"] == "first-turn p95 TTFT: too few values beyond p95 to judge (6 of 120; p95 needs 200)"
    )
    assert all(r["delta"] == 0 for r in cmp["rows"])
    assert all(
        r["significant"] is (None if r["tail"] is not None and r["tail"] < 10 else False) for r in cmp["rows"]
    )
    assert any("same target identity" in w for w in cmp["warnings"])


def test_a_real_cut_is_found_and_sized(tmp_path, run_a):
    run_b = write_run(tmp_path / "b", _records(follow_up_factor=1 / 6.8, noise_seed=1), run_id="b", duration_s=20,
                      targets=_targets("new"))  # fmt: skip
    cmp = compare_runs(run_a, run_b, n_boot=N_BOOT)
    verdicts = {(v["metric"], v["turn_class"]): v for v in cmp["verdicts"]}
    follow = verdicts[("ttft", "follow-up")]
    assert follow["text"].startswith("B cuts follow-up-turn p95 TTFT 6.8\u00d7 ["), follow["text"]
    row = find_row(cmp, "ttft", "follow-up", "p95")
    lo, hi = row["ratio_ci"]
    assert lo < 1 / 6.8 < hi and hi < 1 / 6
    assert "too few values beyond p95" in verdicts[("ttft", "first")]["text"]
    assert "no significant difference" in verdicts[("itl", "all")]["text"]
    assert (
        "p99 of 360 requests rest on under 10 values beyond them: shown, not judged (p99 needs 1,000)"
        in cmp["warnings"]
    )
    text = format_compare(cmp)
    assert "engine=old" in text and "engine=new" in text  # both identities shown


def test_itl_comes_from_the_records_gaps(tmp_path, run_a):
    run_b = write_run(tmp_path / "b", _records(itl_factor=1.5, noise_seed=2), run_id="b", duration_s=20)
    cmp = compare_runs(run_a, run_b, n_boot=N_BOOT)
    gaps = np.concatenate(
        [
            np.asarray(r["itl_us"]) / 1000
            for r in map(orjson.loads, (run_a / "requests.jsonl").read_bytes().splitlines())
        ]
    )
    row = find_row(cmp, "itl", "all", "p50")
    # the run's own figure (summary.json's, from the HDR histogram of the same gaps), to 3 digits the raw one
    assert row["a"] == summarize(run_a)["metrics"]["itl"]["p50"]
    assert row["a"] == pytest.approx(np.percentile(gaps, 50), rel=1e-3)
    assert row["ratio"] == pytest.approx(1.5, rel=0.03) and row["significant"]
    assert row["ratio_ci"][0] < 1.5 < row["ratio_ci"][1]


def test_refuses_different_seeds_unless_forced(tmp_path, run_a):
    run_b = write_run(tmp_path / "b", _records(), run_id="b", duration_s=20, seed=2)
    with pytest.raises(ResultsError) as e:
        compare_runs(run_a, run_b, n_boot=N_BOOT)
    msg = str(e.value)
    assert "differ in seed (1 vs 2)" in msg and "force" in msg and "\n" not in msg
    cmp = compare_runs(run_a, run_b, force=True, n_boot=N_BOOT)
    assert not cmp["paired"] and cmp["pairing"].startswith("unpaired: forced across different seed")
    assert cmp["forced"] and any("forced" in w for w in cmp["warnings"])


def test_refuses_different_workloads(tmp_path, run_a):
    run_b = write_run(
        tmp_path / "b", _records(), run_id="b", workload={"name": "other", "fingerprint": "beef"}
    )
    with pytest.raises(ResultsError, match=r"workload fingerprint \(f00d vs beef\)"):
        compare_runs(run_a, run_b)


def test_formatters(tmp_path, run_a):
    run_b = write_run(tmp_path / "b", _records(follow_up_factor=0.5, noise_seed=3), run_id="b", duration_s=20)
    cmp = compare_runs(run_a, run_b, n_boot=200)
    md = compare_to_markdown(cmp)
    assert "| metric | turns | stat | A | B |" in md and "**B cuts follow-up-turn p95 TTFT" in md
    assert orjson.loads(compare_to_json(cmp))["rows"][0]["metric"] == "ttft"
    svg = ET.fromstring(compare_cdf_svg(cmp, "ttft", "follow-up"))
    paths = [el for el in svg.iter() if el.tag.endswith("path")]
    assert len(paths) == 2


def test_a_shift_smaller_than_the_minimum_effect_is_not_significant(tmp_path, run_a):
    # Every ITL gap 2% longer: the paired intervals are tight enough to exclude 1, but a whole-run
    # shift that small is what two runs of one configuration differ by, so it is noise by default.
    run_b = write_run(tmp_path / "b", _records(itl_factor=1.02, noise_seed=0), run_id="b", duration_s=20)
    cmp = compare_runs(run_a, run_b, n_boot=N_BOOT)
    row = find_row(cmp, "itl", "all", "p50")
    assert row["ratio_ci"][0] > 1.0 and not row["significant"]
    assert cmp["min_effect"] == 0.05
    assert "interval of B/A beyond \u00b15%" in format_compare(cmp)
    plain = compare_runs(run_a, run_b, n_boot=N_BOOT, min_effect=0.0)
    assert find_row(plain, "itl", "all", "p50")["significant"]
    assert "interval of B/A excludes 1" in format_compare(plain)


def test_verdicts_at_another_statistic(tmp_path, run_a):
    run_b = write_run(tmp_path / "b", _records(follow_up_factor=0.5, noise_seed=3), run_id="b", duration_s=20)
    cmp = compare_runs(run_a, run_b, n_boot=N_BOOT, headline_stat="p50")
    texts = [v["text"] for v in cmp["verdicts"]]
    assert all(v["stat"] == "p50" for v in cmp["verdicts"])
    assert any(t.startswith("B cuts follow-up-turn p50 TTFT 1.9") for t in texts), texts
    with pytest.raises(ValueError, match="headline_stat 'p42' is not one of p50, p90, p95, p99, mean"):
        compare_runs(run_a, run_b, headline_stat="p42")
    with pytest.raises(ValueError, match="min_effect must be >= 0"):
        compare_runs(run_a, run_b, min_effect=-0.1)


def test_runs_that_held_their_connections_differently_are_named(tmp_path, run_a):
    # A baseline from before --connections (no key: a connect per session) against a pooled run:
    # the saved connects would otherwise pass for the target's doing.
    pooled = write_run(tmp_path / "b", _records(noise_seed=1), run_id="b", duration_s=20, targets=_targets("new"),
                       config={"connections": "pooled"})  # fmt: skip
    cmp = compare_runs(run_a, pooled, n_boot=N_BOOT)
    assert any(w.startswith("the runs' connections differ (A per-session, B pooled)") for w in cmp["warnings"])
    same = write_run(tmp_path / "c", _records(noise_seed=2), run_id="c", duration_s=20, targets=_targets("new"),
                     config={"connections": "per-session"})  # fmt: skip
    assert not any("connections differ" in w for w in compare_runs(run_a, same, n_boot=N_BOOT)["warnings"])
