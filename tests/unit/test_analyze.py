"""``loadgen workload analyze``: the hit rate as a function of KV capacity, and session shapes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from loadgen.cli import main
from workloads import load_workload, plan_session
from workloads.analyze import analyze_workload
from workloads.inspect import inspect_workload
from workloads.model import STEP_FAN_OUT_CHILD

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "datasets"


def _analyze(*args: str) -> dict:
    r = CliRunner().invoke(main, ["workload", "analyze", *args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_the_hit_rate_grows_with_capacity_to_the_reuse_inspect_reports():
    mooncake = FIX / "mooncake.jsonl"
    caps = [512, 4096, 16384, 1 << 20]
    fig = _analyze(str(mooncake), *(x for c in caps for x in ("--capacity", str(c))))
    pc = fig["prefix_cache"]
    assert pc == {**inspect_workload(load_workload(mooncake))["prefix_cache"], "hit_rate_at": pc["hit_rate_at"]}
    rates = [row["hit_rate"] for row in pc["hit_rate_at"]]
    assert [row["capacity_tokens"] for row in pc["hit_rate_at"]] == caps
    assert rates == sorted(rates) and rates[0] < rates[-1]
    assert rates[-1] == pc["reuse"]  # 1M tokens hold the working set
    assert pc["working_set_tokens"] <= caps[-1]
    # The capacity named for 90% of the reuse realises it, one block less does not.
    wl, B = load_workload(mooncake), pc["block_size"]
    need = pc["capacity_tokens_for"]["90%"]
    at = analyze_workload(wl, capacities_tokens=[need - B, need])["prefix_cache"]["hit_rate_at"]
    assert at[1]["share_of_reuse"] >= 0.9 > at[0]["share_of_reuse"]


def test_session_shapes_count_turns_prompts_think_times_and_fan_out():
    fig = _analyze("agentic-fanout", "-n", "5")
    wl = load_workload("agentic-fanout")
    sessions = [wl.session(0, k) for k in range(5)]
    widths = []
    for s in sessions:
        children: dict[tuple[str, ...], int] = {}
        for step in plan_session(s).steps:
            if step.kind == STEP_FAN_OUT_CHILD:
                children[step.parent_ids] = children.get(step.parent_ids, 0) + 1
        widths += children.values()
    assert fig["sessions"] == 5 and fig["requests"] == sum(len(s.turns) for s in sessions)
    assert fig["fan_out_children"]["count"] == len(widths) and fig["fan_out_children"]["max"] == max(widths)
    assert fig["think_time_s"]["count"] == fig["requests"] - 5
    assert fig["step_kinds"][STEP_FAN_OUT_CHILD] == sum(widths)
    # A request's whole prompt: never shorter than its own message.
    assert fig["prompt_tokens"]["min"] >= fig["new_tokens_per_turn"]["min"]
    assert fig["prompt_tokens"]["total"] > fig["new_tokens_per_turn"]["total"]


@pytest.mark.parametrize(
    "name", ["azure.csv", "burstgpt.csv", "bailian.jsonl", "mooncake_aiperf.jsonl", "sharegpt.json", "openai_chat.jsonl", "weka_traces.jsonl"]
)
def test_every_format_is_analyzed(name):
    r = CliRunner().invoke(main, ["workload", "analyze", str(FIX / name)])
    assert r.exit_code == 0, r.output
    assert "prefix reuse" in r.output and "KV capacity  hit rate  of the reuse" in r.output
    assert "turns per session" in r.output and "prompt tokens" in r.output
