"""The quality gate against real sims: `loadgen quality`, and `loadgen run --quality-gate` passing
(embedded sim, which is told the answers) and refusing a target before any load (exit 2)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from analysis.report import render_report
from analysis.summary import summarize
from analysis.summary_format import format_summary
from loadgen.commands.evalset import load_eval_set
from targets.sim.answers import WRONG_ANSWER

from .runs import loadgen, records, sim, truth

N_ITEMS = len(load_eval_set())
EVAL = str(Path(__file__).resolve().parents[2] / "loadgen" / "evals" / "default.jsonl")
ONE_TURN = """\
name: one-turn
system_prompt_tokens: 8
turns: 1
first_user_tokens: 16
user_tokens: 8
output_tokens: 4
think_time: 0s
"""


def test_quality_command_scores_right_and_wrong_answers(tmp_path: Path):
    with sim(tmp_path, "--profile", "tiny", "--time-scale", "0", "--answers", EVAL) as (right, _), \
         sim(tmp_path, "--profile", "tiny", "--time-scale", "0", "--answers", EVAL, "--wrong-answers") as (wrong, _):  # fmt: skip
        ok = loadgen("quality", "--target", right.url, "--min-score", "1")
        bad = loadgen("quality", "--target", wrong.url, "--min-score", "0.5")
    assert ok.returncode == 0, ok.stderr
    out = ok.stdout.splitlines()
    assert out[0].startswith(f"quality {N_ITEMS}/{N_ITEMS} correct, score 1.000  |  eval default  |  {right.url}")
    rows = out[2 : 2 + N_ITEMS]
    assert all(r.split()[0] == "ok" for r in rows) and "capital-france" in ok.stdout
    assert out[-1] == "gate: score 1.000 >= 1: pass"

    assert bad.returncode == 2
    rows = bad.stdout.splitlines()[2 : 2 + N_ITEMS]
    assert all(r.split()[0] == "WRONG" and r.endswith(WRONG_ANSWER) for r in rows)
    [err] = bad.stderr.strip().splitlines()
    assert err.startswith(f"Error: quality gate: target {wrong.url} scored 0.000 (0/{N_ITEMS}) on eval default")
    assert "below --min-score 0.5; wrong: capital-france, " in err


def test_run_refuses_a_target_below_the_gate_before_any_load(tmp_path: Path):
    wl = tmp_path / "one-turn.yaml"
    wl.write_text(ONE_TURN)
    results = tmp_path / "results"
    with sim(tmp_path, "--profile", "tiny", "--time-scale", "0", "--answers", EVAL, "--wrong-answers") as (s, log):
        r = loadgen(
            "run", "--target", s.url, "--workload", str(wl), "--num-sessions", "3", "--quality-gate", "0.5",
            "--results", str(results), "--run-id", "refused",
        )  # fmt: skip
    assert r.returncode == 2, r.stderr[-2000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"Error: quality gate: target {s.url} scored 0.000 (0/{N_ITEMS})")
    assert last.endswith(", ...") and "wrong: capital-france, capital-japan" in last
    # The sim saw the preflight and the eval, and no load.
    assert len(truth(log)) == 1 + N_ITEMS
    run_dir = results / "refused"
    run = orjson.loads((run_dir / "run.json").read_bytes())
    assert run["status"] == "aborted" and run["exit_code"] == 2 and run["abort_reason"] == last.removeprefix("Error: ")
    q = run["targets"][0]["quality"]
    assert (q["score"], q["correct"], q["total"], q["min_score"], q["passed"]) == (0.0, 0, N_ITEMS, 0.5, False)
    assert {i["answer"] for i in q["items"]} == {WRONG_ANSWER} and not (run_dir / "requests.jsonl").exists()
    assert "cold_start" not in run["targets"][0]  # an external URL: loadgen did not launch it


@pytest.mark.slow  # a whole `loadgen run`: about 9 s on a busy 2-core machine
def test_run_with_the_gate_records_quality_and_cold_start(tmp_path: Path):
    wl = tmp_path / "one-turn.yaml"
    wl.write_text(ONE_TURN)
    results = tmp_path / "results"
    r = loadgen(
        "run", "--profile", "tiny", "--time-scale", "0", "--workload", str(wl), "--num-sessions", "2",
        "--rate", "20", "--quality-gate", "1", "--max-schedule-lag", "10s", "--results", str(results),
        "--run-id", "gated",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"quality: {N_ITEMS}/{N_ITEMS} correct (score 1.000, gate 1: pass)" in r.stderr
    run_dir = results / "gated"
    target = orjson.loads((run_dir / "run.json").read_bytes())["targets"][0]
    q = target["quality"]
    assert (q["score"], q["passed"], q["eval"], q["temperature"]) == (1.0, True, "default", 0.0)
    assert all(i["correct"] and i["answer"] == i["expected"] for i in q["items"])
    [cs] = target["cold_start"]
    assert (cs["name"], cs["role"], cs["url"]) == ("sim-0", "replica", target["fleet"]["replicas"][0]["url"])
    assert 0 < cs["listening_s"] <= cs["healthy_s"] <= cs["first_token_s"] < 60
    assert len(records(run_dir)) == 2  # the load itself: quality requests are not records

    text = format_summary(summarize(run_dir))
    assert f"quality     sim: {N_ITEMS}/{N_ITEMS} correct, score 1.000 (gate 1: pass; eval default)" in text
    assert "cold start  sim: replica sim-0: listening " in text
    html = render_report(run_dir)
    assert "<h3>Cold start" in html and f"<h3>Quality of sim: {N_ITEMS}/{N_ITEMS} correct" in html

