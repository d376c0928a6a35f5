"""The real-vs-predicted routing report: cache counters per arm, follow-up TTFT, ratios."""

from __future__ import annotations

import orjson
import pytest

from loadgen.commands.demo import CPU_WORKLOAD, demo_options
from loadgen.commands.predict import (
    arm_cache,
    follow_up_table,
    prefill_rate,
    ratio_lines,
    run_ab_with_prediction,
)
from loadgen.commands.run import RunOptions
from loadgen.errors import UserError


def summary(mean_ms: float, p95_ms: float) -> dict:
    return {"by_turn_class": {"follow-up": {"metrics": {"ttft": {"mean": mean_ms, "p95": p95_ms}}}}}


def write_arm(d, mean_ms: float, p95_ms: float, cached: list[int], engine: str = "llamacpp") -> None:
    d.mkdir()
    (d / "summary.json").write_bytes(orjson.dumps(summary(mean_ms, p95_ms)))
    recs = [{"turn_class": "first", "status": "ok", "prompt_tokens": 100, "cached_tokens": 0}]
    recs += [{"turn_class": "follow-up", "status": "ok", "prompt_tokens": 200, "cached_tokens": c} for c in cached]
    recs.append({"turn_class": "follow-up", "status": "error", "prompt_tokens": None, "cached_tokens": None})
    (d / "requests.jsonl").write_bytes(b"\n".join(orjson.dumps(r) for r in recs) + b"\n")
    if engine == "llamacpp":
        counters = {
            "llamacpp:prompt_tokens_total": 300.0,
            "llamacpp:prompt_tokens_cached_total": 900.0,
            "llamacpp:prompt_seconds_total": 6.0,
        }
    else:
        counters = {'sim:prefix_cache_queries_total{model_name="m"}': 1200.0, 'sim:prefix_cache_hits_total{model_name="m"}': 900.0}
    metrics = {
        "replica-0": {"url": "u", "counters": counters},
        "replica-1": {"url": "u", "note": "no /metrics page could be read"},
        "router": {"url": "u", "counters": {"smg_x_total": 3.0}},
    }
    (d / "server-metrics.json").write_bytes(orjson.dumps(metrics))


def test_arm_cache_counts_follow_ups_from_records_and_replicas_from_metrics(tmp_path) -> None:
    write_arm(tmp_path / "a", 100, 200, [190, 10])
    c = arm_cache(tmp_path / "a")
    assert (c.follow_ups, c.follow_up_cached, c.follow_up_prompt) == (2, 200, 400)
    assert c.follow_up_share == 0.5
    assert c.replica_hits == {"replica-0": (900.0, 300.0)}
    write_arm(tmp_path / "s", 100, 200, [], engine="sim")
    s = arm_cache(tmp_path / "s")
    assert s.follow_up_share is None and s.replica_hits == {"replica-0": (900.0, 300.0)}
    # llama-server's own prefill rate over both runs: 300 tokens in 6 s; the sim has no such counter
    assert prefill_rate([tmp_path / "a", tmp_path / "a"]) == 50.0
    assert prefill_rate([tmp_path / "s"]) is None


def test_table_and_ratios(tmp_path) -> None:
    dirs = {}
    for name, mean, p95, cached in (("rr", 800, 3000, [20, 30]), ("ca", 200, 500, [190, 195]), ("srr", 600, 2000, [20]), ("sca", 200, 400, [190])):
        dirs[name] = tmp_path / name
        write_arm(dirs[name], mean, p95, cached)
    table = follow_up_table([("llama-server", "rr", dirs["rr"]), ("llama-server", "ca", dirs["ca"])]).splitlines()
    assert table[0].split()[:4] == ["engine", "arm", "follow-ups", "TTFT"]
    assert table[2].split()[:7] == ["llama-server", "rr", "2", "800ms", "3.00s", "12%", "replica-0"]
    assert "75% (900 cached / 300 computed)" in table[2]
    text = ratio_lines(
        ["rr", "ca"],
        [orjson.loads((dirs[n] / "summary.json").read_bytes()) for n in ("rr", "ca")],
        [orjson.loads((dirs[n] / "summary.json").read_bytes()) for n in ("srr", "sca")],
    )
    assert text.splitlines() == [
        "follow-up-turn TTFT, rr / ca:",
        "  mean: real 4.0x, predicted 3.0x (predicted/real 0.75)",
        "  p95: real 6.0x, predicted 5.0x (predicted/real 0.83)",
    ]


def test_demo_on_llama_server_runs_the_smaller_workload_on_four_slots() -> None:
    opts = demo_options(quick=False, results="r", engine="llama-server")
    assert (opts.engine, opts.workload, opts.llama_parallel, opts.concurrency, opts.num_sessions) == (
        "llama-server", CPU_WORKLOAD, 4, 8, 8
    )
    sim = demo_options(quick=False, results="r")
    assert (sim.engine, sim.seed, sim.concurrency) == ("sim", opts.seed, opts.concurrency)


@pytest.mark.parametrize(
    ("opts", "arms", "message"),
    [
        (RunOptions(engine="sim"), [("a", "x"), ("b", "y")], "for --engine llama-server"),
        (RunOptions(engine="llama-server"), [("a", "x"), ("b", "y"), ("c", "z")], "exactly two arms"),
    ],
)
def test_prediction_needs_llama_server_and_two_arms(opts, arms, message) -> None:
    with pytest.raises(UserError, match=message):
        run_ab_with_prediction(arms, opts)


def test_demo_agents_cpu_is_demo_agents_scaled_down() -> None:
    from workloads import load_workload
    from workloads.tokenizer import count_tokens

    sessions = list(load_workload(CPU_WORKLOAD).sessions(seed=7, n=40))
    for s in sessions:
        system, first = count_tokens(s.system_prompt), count_tokens(s.turns[0].content)
        assert 3 <= len(s.turns) <= 5 and 20 <= system <= 30 and 80 <= first <= 140
        # cache_aware places a new session by load only while the shared prompt is under its
        # 0.3 cache threshold of the first request
        assert system < 0.3 * (system + first)
        assert all(count_tokens(t.content) <= 30 and 6 <= t.max_tokens <= 10 for t in s.turns[1:])
        assert all(5.0 <= t.think_time_s <= 12.0 for t in s.turns[1:])
