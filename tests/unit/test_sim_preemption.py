"""Preemption under KV pressure (profile ``preemption``): blocks on demand, the newest running
request preempted in recompute mode when a block can't be had, as vLLM V1 does."""

from __future__ import annotations

import dataclasses

from targets.sim.engine import Arrival, Engine, simulate
from targets.sim.profile import load_profile

# 16 blocks of 16 tokens: four 32-token prompts fit, their 100-token replies (9 blocks each) don't.
SMALL_KV = {"kv_capacity_tokens": 256, "max_model_len": 256, "max_num_seqs": 8, "block_size_tokens": 16}
MAX_TOKENS = 100


def arrivals() -> list[Arrival]:
    return [Arrival(0.0, f"r{i}", [1000 + 37 * i + k for k in range(32)], MAX_TOKENS) for i in range(4)]


def run(preemption: bool) -> tuple[Engine, dict]:
    profile = dataclasses.replace(load_profile("tiny"), **SMALL_KV, preemption=preemption)
    engine = Engine(profile, seed=0)
    return engine, simulate(engine, arrivals())


def test_preempted_requests_complete_with_every_token_and_their_stall_shows_in_itl() -> None:
    engine, seqs = run(preemption=True)
    assert engine.stats.preemptions > 0
    assert engine.stats.preemptions == sum(s.preemptions for s in seqs.values())
    step_s = min(
        b - a for s in seqs.values() for a, b in zip(s.token_times_s, s.token_times_s[1:], strict=False)
    )
    # r1..r3 were admitted after r0 (FCFS), so they are the newest and the ones preempted.
    for s in seqs.values():
        assert s.state == "finished" and s.generated == len(s.token_times_s) == MAX_TOKENS
        assert s.token_times_s == sorted(s.token_times_s)
        gaps = [b - a for a, b in zip(s.token_times_s, s.token_times_s[1:], strict=False)]
        if s.preemptions:  # it waited for blocks, then recomputed prompt + reply: a stall of steps
            assert max(gaps) > 3 * step_s, s.rid
        else:  # one token a step all along
            assert max(gaps) < 2 * step_s, s.rid
    victims = [s for s in seqs.values() if s.preemptions]
    assert victims and seqs["r0"].preemptions == 0  # the oldest keeps its place; the newest go first
    assert engine.cache.used_blocks == 0 and engine.stats.generation_tokens == 4 * MAX_TOKENS


def test_without_preemption_admission_reserves_every_block_and_nothing_is_preempted() -> None:
    engine, seqs = run(preemption=False)
    assert engine.stats.preemptions == 0 and all(s.preemptions == 0 for s in seqs.values())
    assert all(s.generated == MAX_TOKENS for s in seqs.values())
    # One request's reply (9 of 16 blocks) at a time: the second starts after the first finishes.
    assert seqs["r1"].first_token_s > seqs["r0"].token_times_s[-1]
