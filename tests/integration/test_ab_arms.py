"""`loadgen ab`: one fresh fleet per arm, and each arm's results directory complete on its own."""

from __future__ import annotations

import orjson

from .runs import loadgen, records

ARMS = {"rr": "round_robin", "ca": "cache_aware"}


def test_each_arm_has_a_complete_results_directory_with_its_router(tmp_path):
    results = tmp_path / "results"
    r = loadgen(
        "ab", "--arms", "rr=sglang:round_robin,ca=sglang:cache_aware", "--replicas", "2",
        "--profile", "tiny", "--time-scale", "0.5", "--workload", "tiny", "--concurrency", "2",
        "--num-sessions", "4", "--seed", "3", "--results", str(results), "--run-id", "pair",
        # Two fleets' worth of processes share two cores: the arms' bookkeeping is under test here,
        # not the generator's schedule (tests/integration/test_generator_saturation.py is).
        "--max-schedule-lag", "10s",
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert sorted(p.name for p in results.iterdir()) == ["pair-ca", "pair-rr"]

    sessions = {}
    for arm, policy in ARMS.items():
        d = results / f"pair-{arm}"
        for name in ("run.json", "requests.jsonl", "metrics.hlog", "summary.json", "server-metrics.json"):
            assert (d / name).is_file(), (arm, name)
        run = orjson.loads((d / "run.json").read_bytes())
        assert run["status"] == "complete" and run["run_id"] == f"pair-{arm}"
        target = run["targets"][0]
        assert target["label"] == arm and target["kind"] == "router"
        router = target["fleet"]["router"]
        assert (router["name"], router["policy"]) == ("sglang-router", policy)
        assert router["version"] and router["worker_urls"] == [x["url"] for x in target["fleet"]["replicas"]]
        summary = orjson.loads((d / "summary.json").read_bytes())
        assert summary["requests"]["measured"] == len(records(d)) > 0 and summary["requests"]["errors"] == 0
        # The arm stands alone: `loadgen report` rebuilds its summary from its own files.
        again = loadgen("report", str(d))
        assert again.returncode == 0, again.stderr[-2000:]
        sessions[arm] = sorted((x.session_id, x.turn_index, x.max_tokens) for x in records(d))
    # Same seed, fresh fleet each: the arms replay the same sessions (a paired comparison).
    assert sessions["rr"] == sessions["ca"]

    assert "metric  turns      stat" in r.stdout and "ca/rr" in r.stdout
    assert "ca vs rr: follow-up-turn TTFT mean " in r.stdout
    assert "requests per replica" in r.stdout
    assert f"results: {results / 'pair-rr'}, {results / 'pair-ca'}" in r.stdout
