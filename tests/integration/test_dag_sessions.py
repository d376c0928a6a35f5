"""Fan-out sessions end to end: `loadgen run` (a Locust master and worker) through a real
sglang-router (cache_aware) to two tiny sims on 127.0.0.1.

What the records say is checked against what the sims say they did (/sim/requests/<id>): which
replica served each request and how many prompt tokens its prefix cache held.
"""

from __future__ import annotations

import http.client
import json
from collections import defaultdict

import orjson
import pytest

from targets.fleet.fleet import start_sim_replicas
from targets.fleet.procs import stop_all
from targets.fleet.routers import start_router

from .runs import loadgen, records, run_dir

BLOCK = 16  # the tiny profile's prefix-cache block, in tokens
SESSIONS = 4
CHILDREN = 4
# Each session: plan, 4 concurrent reads, the join (no think time, so it is intended at the last
# child's end), then one tool result. The plan's own 200-token opening keeps the shared system
# prompt under cache_aware's 30% match threshold, so sessions are placed by load.
WORKLOAD = f"""\
name: fan-out-test
system_prompt_tokens: 20
first_user_tokens: 200
user_tokens: 30
output_tokens: 12
think_time: 0ms
tool_output_tokens: 20
tool_time: 20ms
steps:
  - {{id: plan, kind: request}}
  - {{id: read, kind: fan_out, k: {CHILDREN}, tool: read_file}}
  - {{id: decide, kind: request}}
  - {{id: patch, kind: tool, tool: apply_patch}}
"""


def _truth(replica_url: str, request_id: str) -> dict | None:
    host, port = replica_url.removeprefix("http://").split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=5)
    try:
        c.request("GET", f"/sim/requests/{request_id}")
        resp = c.getresponse()
        body = resp.read()
        return json.loads(body) if resp.status == 200 else None
    finally:
        c.close()


@pytest.mark.slow
def test_fan_out_children_go_together_hit_the_parents_cache_and_join_after_the_last(tmp_path):
    replicas = start_sim_replicas(
        2, profile="tiny", time_scale=1.0, seed=3, log_dir=tmp_path / "sims", startup_timeout_s=30
    )
    try:
        router = start_router("sglang:cache_aware", [r.url for r in replicas], log_dir=tmp_path, startup_timeout_s=30)
        try:
            wl = tmp_path / "fan-out.yaml"
            wl.write_text(WORKLOAD)
            r = loadgen(
                "run", "--target", router.url, "--workload", str(wl), "--num-sessions", str(SESSIONS),
                "--rate", "4", "--seed", "9", "--results", str(tmp_path / "results"), "--max-schedule-lag", "10s",
            )  # fmt: skip
            assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
            d = run_dir(tmp_path / "results")
            recs = records(d)
            truth = {}
            for rec in recs:
                found = [(rep.server_id, t) for rep in replicas if (t := _truth(rep.url, rec.request_id))]
                assert len(found) == 1, (rec.request_id, found)
                truth[rec.request_id] = found[0]
        finally:
            stop_all([router.process])
    finally:
        stop_all([rep.process for rep in replicas])

    steps_per_session = 1 + CHILDREN + 2
    assert len(recs) == SESSIONS * steps_per_session and all(rec.ok for rec in recs)
    by_session: dict[str, dict[str, object]] = defaultdict(dict)
    for rec in recs:
        by_session[rec.session_id][rec.step_id] = rec
    for steps in by_session.values():
        plan, join, patch = steps["plan"], steps["decide"], steps["patch"]
        children = [steps[f"read.{i}"] for i in range(CHILDREN)]
        assert (plan.step_kind, plan.depth, plan.parent_ids) == ("first", 0, [])
        assert all((c.step_kind, c.depth, c.parent_ids) == ("fan-out child", 1, ["plan"]) for c in children)
        assert (join.step_kind, join.depth, join.parent_ids) == ("join", 2, [f"read.{i}" for i in range(CHILDREN)])
        assert (patch.step_kind, patch.depth, patch.session_steps) == ("follow-up", 3, steps_per_session)

        sends = [c.t_send_us for c in children]
        assert max(sends) - min(sends) <= 5_000, sends
        # The join is intended at the end of the last child (think time 0) and sent after it.
        last_child_end = max(c.t_end_us for c in children)
        assert join.t_sched_us == last_child_end and join.t_send_us >= last_child_end

        # Ground truth: every child ran on the parent's replica and found in its cache all the
        # full blocks of the parent's prompt and reply (they exist only where the parent ran).
        parent_server, parent_truth = truth[plan.request_id]
        parent_blocks = (parent_truth["prompt_tokens"] + parent_truth["completion_tokens"] - 1) // BLOCK * BLOCK
        for c in children:
            server, t = truth[c.request_id]
            assert server == parent_server, (c.step_id, server, parent_server)
            assert t["cached_tokens"] >= parent_blocks, (c.step_id, t["cached_tokens"], parent_blocks)
        # The join's prompt holds the children's outputs as tool results: longer than any child's.
        assert truth[join.request_id][1]["prompt_tokens"] > max(truth[c.request_id][1]["prompt_tokens"] for c in children)

    # Task time in summary.json equals the one computed here from requests.jsonl (HDR: 3 digits).
    summary = orjson.loads((d / "summary.json").read_bytes())
    task_ms = sorted(
        (max(r.t_last_us for r in s.values()) - min(r.t_send_us for r in s.values())) / 1000
        for s in by_session.values()
    )
    got = summary["sessions"]["task_time"]
    assert summary["sessions"]["complete"] == got["count"] == SESSIONS
    assert got["min"] == pytest.approx(task_ms[0], rel=1e-3) and got["max"] == pytest.approx(task_ms[-1], rel=1e-3)
    assert got["mean"] == pytest.approx(sum(task_ms) / len(task_ms), rel=1e-3)
    kinds = summary["by_step_kind"]
    assert {k: v["requests"] for k, v in kinds.items()} == {
        "first": SESSIONS, "follow-up": SESSIONS, "fan-out child": SESSIONS * CHILDREN, "join": SESSIONS,
    }  # fmt: skip
    assert kinds["fan-out child"]["metrics"]["ttft"]["count"] == SESSIONS * CHILDREN


def test_a_cyclic_step_spec_is_a_one_line_error_with_exit_2(tmp_path):
    wl = tmp_path / "cycle.yaml"
    wl.write_text(
        "name: cycle\nuser_tokens: 10\noutput_tokens: 4\nsteps:\n"
        "  - {id: plan, kind: request, after: edit}\n  - {id: edit, kind: request}\n"
    )
    r = loadgen("run", "--workload", str(wl), "--num-sessions", "1", "--results", str(tmp_path / "results"))
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert lines[-1] == (
        f"Error: --workload: {wl}: steps: steps form a cycle (edit -> plan -> edit); a session's steps must be acyclic"
    ), r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir())
