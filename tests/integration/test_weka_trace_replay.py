"""A WekaTrace file replayed end to end (a real Locust master and worker) against one tiny sim,
checked against what the sim says it did (its truth log): every request of the trace is sent, the
sub-agents arrive as fan-out branches on the parent's context (each sub-agent's requests in order,
the overlapping sub-agents together), the next main request waits for them, and the prefix cache hits
what the replayed history and the blocks a trace's sub-agents share imply (global scope), and no
more (local scope, other traces).
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path

import pytest

from workloads import load_workload

from .runs import loadgen, records, run_dir, sim, truth

WEKA = Path(__file__).resolve().parent.parent / "fixtures" / "datasets" / "weka_traces.jsonl"
BLOCK = 16  # the tiny profile's prefix-cache block, in tokens


def _full_blocks(t: dict) -> int:
    """Tokens of a request's prompt and reply in whole cache blocks (the reply's last token is not
    in the KV cache)."""
    return (t["prompt_tokens"] + t["completion_tokens"] - 1) // BLOCK * BLOCK


@pytest.mark.slow  # ~6 s of CPU; 11-14 s of wall time on a busy 2-core machine
def test_weka_trace_sub_agents_fan_out_on_the_parents_cache_and_the_shared_blocks_hit(tmp_path):
    traces = [json.loads(line) for line in WEKA.read_text().splitlines()]
    wl = load_workload(WEKA)
    # Sim time x10: a sub-agent's request lasts ~250 ms, well over the 10 ms by which the trace's
    # second sub-agent starts after the first, so the two are in flight together on a busy machine.
    with sim(tmp_path, "--profile", "tiny", "--time-scale", "10", "--seed", "2") as (proc, truth_log):
        # One agent at a time: each session's first request comes after the earlier sessions ended.
        r = loadgen(
            "run", "--target", proc.url, "--workload", str(WEKA), "--concurrency", "1", "--num-sessions", "3",
            "--seed", "5", "--results", str(tmp_path / "res"), "--max-schedule-lag", "1s",
        )  # fmt: skip
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    recs = records(run_dir(tmp_path / "res"))
    seen = truth(truth_log)
    sessions = [wl.session(5, k) for k in range(3)]
    assert len(recs) == sum(len(s.turns) for s in sessions) and all(x.ok for x in recs)
    # As many requests as the traces hold: every request of every sub-agent was sent.
    assert len(recs) == sum(len(e["requests"]) if e.get("type") == "subagent" else 1 for t in traces for e in t["requests"])
    # The branches' later steps are follow-ups to the summary's step-kind breakdown.
    summary = json.loads((run_dir(tmp_path / "res") / "summary.json").read_text())
    kinds = Counter(t.kind for s in sessions for t in s.turns)
    assert {k: v["requests"] for k, v in summary["by_step_kind"].items()} == kinds
    later = sum(len(e["requests"]) - 1 for t in traces for e in t["requests"] if e.get("type") == "subagent")
    assert later > 0 and sum(x.step_kind == "follow-up" and "." in x.step_id for x in recs) == later
    steps = {(x.session_id, x.step_id): x for x in recs}
    sim_of = {key: seen[x.request_id] for key, x in steps.items()}  # every request reached the sim
    for s in sessions:
        by_id = {t.step_id: t for t in s.turns}
        for t in s.turns:
            x = steps[(s.session_id, t.step_id)]
            assert (x.step_kind, tuple(x.parent_ids), x.max_tokens) == (t.kind, t.parent_ids, t.max_tokens)
            mine = sim_of[(s.session_id, t.step_id)]
            assert mine["prompt_tokens"] == x.prompt_tokens and mine["completion_tokens"] == t.max_tokens
            for p in t.parent_ids:
                parent = sim_of[(s.session_id, p)]
                # Causality as the sim saw it: a step arrives after every step it waits for ended...
                assert mine["t_received_ns"] >= parent["t_end_ns"], (s.session_id, t.step_id, p)
            if t.kind in ("fan-out child", "follow-up"):
                # ...and finds its parent's prompt and reply in the cache (the replayed history).
                assert mine["cached_tokens"] >= _full_blocks(sim_of[(s.session_id, t.parent_ids[0])]), t.step_id
            if t.kind == "join":  # the fan-out's parent context, with the branches' outputs after it
                child = t.parent_ids[0]
                while by_id[child].kind != "fan-out child":  # up the branch to its child
                    child = by_id[child].parent_ids[0]
                fanned = by_id[child].parent_ids[0]
                assert mine["cached_tokens"] >= _full_blocks(sim_of[(s.session_id, fanned)]), t.step_id
    a, b, c = (s.session_id for s in sessions)
    # cc-a's two sub-agents overlap in the trace and so were in the sim together; the first one's
    # three requests reached it one after the other, each extending the one before (the sim saw
    # the branch's history: its prompt holds the previous request's prompt and reply), and the
    # join came after the last request of both.
    branch = [sim_of[(a, sid)] for sid in ("r2", "r2.1", "r2.2")]
    r2, r3 = branch[0], sim_of[(a, "r3")]
    assert r3["t_received_ns"] < r2["t_end_ns"] and r2["t_received_ns"] < r3["t_end_ns"]
    for before, after in itertools.pairwise(branch):
        assert after["t_received_ns"] >= before["t_end_ns"]
        assert after["prompt_tokens"] > before["prompt_tokens"] + before["completion_tokens"]
    assert sim_of[(a, "r4")]["t_received_ns"] >= max(branch[-1]["t_end_ns"], r3["t_end_ns"])
    bs = traces[0]["block_size"]
    # cc-b (global scope): its second sub-agent, sent 130 ms after its parent's end, found the first
    # one's tool definitions (three shared blocks) in the cache after the parent's context...
    shared = 3 * bs
    assert traces[1]["requests"][2]["requests"][0]["hash_ids"][:3] == traces[1]["requests"][1]["requests"][0]["hash_ids"][:3]
    parent_b = _full_blocks(sim_of[(b, "r0")])
    assert sim_of[(b, "r2")]["cached_tokens"] >= parent_b + shared
    # ...while cc-c's, of local scope with the same ids, found only its parent's context.
    parent_c = _full_blocks(sim_of[(c, "r1")])
    assert parent_c <= sim_of[(c, "r3")]["cached_tokens"] < parent_c + bs
    # Traces share no blocks: cc-b and cc-c open with cc-a's ids, and find none of its blocks.
    assert traces[1]["requests"][0]["hash_ids"][:4] == traces[2]["requests"][0]["hash_ids"][:4] == traces[0]["requests"][0]["hash_ids"][:4]
    assert sim_of[(b, "r0")]["cached_tokens"] < bs and sim_of[(c, "r0")]["cached_tokens"] < bs
