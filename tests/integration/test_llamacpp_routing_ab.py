"""``loadgen ab --engine llama-server``: round_robin vs cache_aware on two real llama-server replicas.

A reduced routing A/B: one agent runs three three-turn sessions (one ~120-token opening message,
short follow-ups) through sglang-router, once per policy, each arm on fresh replicas. With one
agent, consecutive requests are a session's consecutive turns, so round_robin sends every
follow-up to the replica that did not serve the turn before: each session's first follow-up
lands where its opening message was never seen. cache_aware keeps each session where its prefix
is. The replicas' own timings (``cache_n``, ``prompt_ms``) and ``/metrics`` counters are the
ground truth; the client's follow-up TTFT must follow them.

Marked ``llamacpp`` and ``slow`` like the other llama-server tests: 40-65 s on two busy cores.
"""

from __future__ import annotations

import itertools
import statistics
from pathlib import Path

import orjson
import pytest

from analysis.records import RequestRecord
from tests.integration.runs import loadgen, records

pytestmark = [pytest.mark.llamacpp, pytest.mark.slow]

WORKLOAD = """\
name: llama-routing
description: Short agent sessions whose opening message is most of every later prompt.
system_prompt_tokens: 0
turns: 3
first_user_tokens: 120
user_tokens: 4
output_tokens: 4
think_time: 10ms
"""
SESSIONS, TURNS = 3, 3
ARMS = ("round_robin", "cache_aware")


@pytest.fixture(scope="module")
def ab_dirs(tmp_path_factory, llama_paths) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("routing-ab")
    workload = tmp / "llama-routing.yaml"
    workload.write_text(WORKLOAD)
    results = tmp / "results"
    proc = loadgen(
        "ab", "--engine", "llama-server", "--no-predict", "--replicas", "2",
        "--llama-parallel", "2", "--llama-ctx", "2048",
        "--arms", ",".join(f"{a}=sglang:{a}" for a in ARMS),
        "--workload", str(workload), "--concurrency", "1", "--num-sessions", str(SESSIONS), "--seed", "5",
        "--request-timeout", "60s", "--max-schedule-lag", "1s",
        "--results", str(results), "--run-id", "ab", timeout_s=150.0,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "cache_aware vs round_robin: follow-up-turn TTFT" in proc.stdout
    return {arm: results / f"ab-{arm}" for arm in ARMS}


def _sessions(recs: list[RequestRecord]) -> list[list[RequestRecord]]:
    out: dict[str, list[RequestRecord]] = {}
    for r in sorted(recs, key=lambda r: (r.session_id, r.turn_index)):
        out.setdefault(r.session_id, []).append(r)
    return list(out.values())


def _follow_ups(run_dir: Path) -> list[RequestRecord]:
    recs = records(run_dir)
    assert len(recs) == SESSIONS * TURNS and all(r.ok for r in recs)
    assert all(r.server_timings is not None for r in recs)
    return [r for r in recs if r.turn_class == "follow-up"]


def test_the_replicas_caches_say_which_policy_kept_sessions_in_place(ab_dirs) -> None:
    rr, ca = (_sessions(records(ab_dirs[a])) for a in ARMS)
    # cache_aware: every follow-up found its whole previous prompt in the cache.
    for turns in ca:
        for prev, cur in itertools.pairwise(turns):
            assert cur.server_timings["cache_n"] >= prev.prompt_tokens, (prev.request_id, cur.server_timings)
    # round_robin: each session's first follow-up went to the replica that never saw its opening
    # message (only the chat template's opening tokens are shared between sessions).
    for turns in rr:
        assert turns[1].server_timings["cache_n"] < turns[0].prompt_tokens / 2, turns[1].server_timings
    cached = {a: sum(r.server_timings["cache_n"] for r in _follow_ups(ab_dirs[a])) for a in ARMS}
    assert cached["cache_aware"] > cached["round_robin"], cached


def test_the_replicas_metrics_agree_with_the_records(ab_dirs) -> None:
    share = {}
    for arm in ARMS:
        report = orjson.loads((ab_dirs[arm] / "server-metrics.json").read_bytes())
        counters = [v["counters"] for k, v in report.items() if k.startswith("replica-")]
        assert len(counters) == 2
        cached = sum(c["llamacpp:prompt_tokens_cached_total"] for c in counters)
        computed = sum(c["llamacpp:prompt_tokens_total"] for c in counters)
        recs = records(ab_dirs[arm])
        assert cached == sum(r.server_timings["cache_n"] for r in recs)
        assert computed == sum(r.server_timings["prompt_n"] for r in recs)
        share[arm] = cached / (cached + computed)
    assert share["cache_aware"] > share["round_robin"], share


def test_cache_aware_follow_ups_are_faster(ab_dirs) -> None:
    # Sums and means over the six follow-ups of each arm. round_robin computes each session's
    # opening message again (3 x ~145 tokens) where cache_aware computes ~20 new tokens per
    # follow-up: about 4x the tokens; in time, where each step also has a fixed cost (~0.3 s on
    # one thread) and single requests vary up to 2x with the machine's load, about 2.5-3x.
    computed = {a: sum(r.server_timings["prompt_n"] for r in _follow_ups(ab_dirs[a])) for a in ARMS}
    prefill = {a: sum(r.server_timings["prompt_ms"] for r in _follow_ups(ab_dirs[a])) for a in ARMS}
    ttft = {a: statistics.mean(r.ttft_us for r in _follow_ups(ab_dirs[a])) for a in ARMS}
    assert computed["cache_aware"] < computed["round_robin"] / 3, computed
    assert prefill["cache_aware"] < 0.7 * prefill["round_robin"], prefill
    assert ttft["cache_aware"] < 0.7 * ttft["round_robin"], ttft
