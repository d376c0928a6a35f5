"""Two real runs on the sim: `loadgen compare` prints the percentiles their summary.json holds.

The runs replay the same seeded sessions (paired) on sims of different speed; B has a warm-up, so
its summary's histograms are rebuilt from the measured records while A's come from metrics.hlog.
Every p50/p95 (and the rest) per turn class that compare prints is summary.json's, bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import orjson

from .runs import loadgen

RUN = ("--workload", "tiny", "--profile", "tiny", "--rate", "8", "--duration", "2s", "--seed", "11",
       "--max-schedule-lag", "10s")  # fmt: skip  (percentiles are the subject, not the generator)


def _run(results: Path, run_id: str, *args: str) -> dict:
    r = loadgen("run", *RUN, "--results", str(results), "--run-id", run_id, *args)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return orjson.loads((results / run_id / "summary.json").read_bytes())


def test_compare_prints_each_runs_summary_percentiles(tmp_path):
    sa = _run(tmp_path, "a", "--time-scale", "5")
    sb = _run(tmp_path, "b", "--time-scale", "3", "--warmup", "0.5s")
    assert (sa["histogram_source"], sb["histogram_source"]) == ("metrics.hlog", "requests.jsonl")
    r = loadgen("compare", str(tmp_path / "a"), str(tmp_path / "b"), "--json", "--n-boot", "200")
    assert r.returncode == 0, r.stderr[-2000:]
    cmp = orjson.loads(r.stdout)
    assert cmp["paired"]
    checked = 0
    for row in cmp["rows"]:
        for arm, s in (("a", sa), ("b", sb)):
            group = s if row["turn_class"] == "all" else s["by_turn_class"][row["turn_class"]]
            want = group["metrics"][row["metric"]][row["stat"]]
            assert row[arm] == want, (row["metric"], row["turn_class"], row["stat"], arm, row[arm], want)
            checked += row["stat"] in ("p50", "p95") and row["turn_class"] != "all"
    metrics = {row["metric"] for row in cmp["rows"]}
    assert {"ttft", "tpot", "itl", "e2e"} <= metrics
    assert checked == 2 * 2 * 2 * len(metrics)  # arms x stats x turn classes x metrics
