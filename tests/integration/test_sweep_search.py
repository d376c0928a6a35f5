"""`loadgen sweep` on the sim: the bisection finds the max rate a dense grid finds, within one step.

Every point is a complete `loadgen run` (tiny sim profile slowed 10x, constant arrivals, 1.5 s of
load) with its own results directory under the sweep's. The tiny engine has 8 slots; TTFT p99 climbs
from ~30 ms at 8 sessions/s to well over 100 ms at 16/s as requests start to queue for a slot, so
``ttft_p99=100ms`` binds between 12 and 16. The bisection over [4, 20] in 2 halvings ends with a
4/s bracket; the grid runs every 4/s across the knee.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from .runs import loadgen
from .test_report_outputs import open_in_chromium, svgs_by_section

pytestmark = pytest.mark.slow

RUN = (
    "--workload", "tiny", "--profile", "tiny", "--time-scale", "10", "--arrival", "constant",
    "--duration", "1.5s", "--seed", "3", "--slo", "ttft_p99=100ms", "--cost-per-hour", "3.6",
    # The search is under test, not the generator: two shared cores may run it a few ms late.
    "--max-schedule-lag", "50ms",
)  # fmt: skip
LO, HI, STEPS = 4.0, 20.0, 2
STEP = (HI - LO) / 2**STEPS  # the bracket the bisection ends with: 4/s


def _sweep(results: Path, run_id: str, *args: str) -> tuple[dict, str]:
    r = loadgen("sweep", *RUN, "--results", str(results), "--run-id", run_id, *args, timeout_s=300)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    return orjson.loads((results / run_id / "sweep.json").read_bytes()), r.stdout


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory) -> dict:
    results = tmp_path_factory.mktemp("sweeps")
    dense, dense_out = _sweep(results, "grid", "--rates", "8,12,16")
    found, found_out = _sweep(results, "search", "--search", "--min-rate", f"{LO:g}", "--max-rate", f"{HI:g}",
                              "--steps", str(STEPS))  # fmt: skip
    return {"results": results, "grid": dense, "grid_out": dense_out, "search": found, "search_out": found_out}


def test_bisection_matches_a_dense_grid_within_one_step(sweeps, capsys):
    results, dense, found, found_out = sweeps["results"], sweeps["grid"], sweeps["search"], sweeps["search_out"]
    assert dense["status"] == found["status"] == "complete"
    assert dense["method"] == "grid" and found["method"] == "bisect"
    assert [p["rate_per_s"] for p in dense["points"]] == [8, 12, 16]
    assert len(found["points"]) == 2 + STEPS
    grid_max, search_max = dense["max_rate_per_s"], found["max_rate_per_s"]
    assert grid_max is not None and 8 <= grid_max < 16, sweeps["grid_out"]  # the SLO binds inside the grid
    assert search_max is not None and abs(search_max - grid_max) <= STEP, (grid_max, search_max, found_out)

    # every point is a complete results directory with its own summary
    for sweep_id, sweep in (("grid", dense), ("search", found)):
        for p in sweep["points"]:
            d = results / sweep_id / p["run_id"]
            info = orjson.loads((d / "run.json").read_bytes())
            assert info["status"] == "complete" and info["arrival"]["rate_per_s"] == p["rate_per_s"]
            assert (d / "requests.jsonl").stat().st_size > 0 and (d / "summary.json").exists()
    # the answer line: the max rate, goodput and tokens per dollar there
    best = next(p for p in found["points"] if p["rate_per_s"] == search_max)
    assert best["goodput_requests_per_s"] > 0 and best["output_tokens_per_usd"] > 0
    assert f"max rate holding the SLOs: {search_max:g}/s; there goodput " in found_out
    assert "output tokens/$" in found_out
    assert found["slo_applied"] == "ttft_p99=100ms,ttft=100ms"  # goodput counts requests under the TTFT limit
    with capsys.disabled():
        print(f"\n[sweep] grid 8..16 by 4: max {grid_max:g}/s; bisection [{LO:g}, {HI:g}] in {STEPS} steps: "
              f"max {search_max:g}/s ({len(found['points'])} runs)")  # fmt: skip


@pytest.mark.browser
def test_the_sweep_report_renders_in_chromium_with_every_plot(sweeps, chromium, artifacts_dir):
    page = sweeps["results"] / "search" / "sweep.html"
    dom = open_in_chromium(chromium, page, artifacts_dir, "report-sweep", height=1800)
    plots = svgs_by_section(dom)["sweep-plots"]
    assert plots == 6, plots  # ttft, itl, tpot, e2e vs rate; throughput and goodput; tokens per dollar
    assert f"max rate {sweeps['search']['max_rate_per_s']:g} sessions/s" in dom
    assert "rate-4" in dom and "<script" not in dom


def test_sweep_flags_are_checked_before_any_run(tmp_path):
    cases = {
        ("--rates", "1,2", "--rate", "3"): "sweep sets the rate of each run; drop --rate",
        ("--search", "--min-rate", "4"): "--search needs --min-rate and --max-rate",
        ("--search", "--min-rate", "8", "--max-rate", "4"): "--min-rate 8 must be below --max-rate 4",
        ("--rates", "1,fast"): "--rates: 'fast' is not a rate",
        ("--rates", "1", "--concurrency", "4"): "drop --concurrency",
        (): "give either --rates 1,2,4,8 (a grid) or --search",
    }
    for args, message in cases.items():
        r = loadgen("sweep", "--slo", "ttft_p99=1s", "--results", str(tmp_path), *args)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (args, r.stderr)
        (line,) = r.stderr.strip().splitlines()
        assert line.startswith("Error: ") and message in line, (args, line)
    r = loadgen("sweep", "--rates", "1", "--results", str(tmp_path))
    assert r.returncode == 2 and "sweep needs --slo with at least one percentile SLO" in r.stderr
    assert list(tmp_path.iterdir()) == []  # nothing ran, nothing written


def test_a_point_whose_generator_fell_behind_is_not_the_servers_miss(tmp_path):
    # A 1 us bound on the generator's own lag: every point counts as generator-saturated (exit 4),
    # whatever the server did, so the sweep names no limit of the server's and exits 4 itself.
    r = loadgen("sweep", *RUN, "--max-schedule-lag", "1us", "--rates", "4", "--results", str(tmp_path),
                "--run-id", "behind", timeout_s=120)  # fmt: skip
    assert r.returncode == 4, (r.stdout[-3000:], r.stderr[-3000:])
    sweep = orjson.loads((tmp_path / "behind" / "sweep.json").read_bytes())
    (point,) = sweep["points"]
    assert point["exit_code"] == 4 and point["outcome"] == "generator" and not point["ok"]
    summary = orjson.loads((tmp_path / "behind" / point["run_id"] / "summary.json").read_bytes())
    assert summary["generator"]["saturated"]
    assert sweep["max_rate_per_s"] is None and sweep["limited_by"] == "generator" and sweep["exit_code"] == 4
    answer = "max rate holding the SLOs: none measured: the generator could not keep up at 4/s (add workers)"
    assert answer in r.stdout, r.stdout[-3000:]
