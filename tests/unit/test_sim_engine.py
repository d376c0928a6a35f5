"""The simulated engine on its virtual clock: no sockets, exact expectations from the cost model."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random

import pytest

from targets.sim.engine import Arrival, Engine, QueueFull, RequestTooLong, simulate
from targets.sim.prefix_cache import block_hashes
from targets.sim.profile import load_profile
from targets.sim.text import WORD_TOKEN_IDS

TINY = load_profile("tiny")


def prompt(n: int, salt: int = 0) -> list[int]:
    rng = random.Random(salt)
    return [rng.randrange(2**32) for _ in range(n)]


def profile(**overrides):
    return dataclasses.replace(TINY, **overrides)


def run_one(p, prompt_ids, max_tokens=4, engine=None):
    engine = engine or Engine(p)
    seq = simulate(engine, [Arrival(engine.now, "r", prompt_ids, max_tokens)])["r"]
    return engine, seq


def ttft(seq) -> float:
    return seq.first_token_s - seq.arrival_s


# --- prefill -----------------------------------------------------------------------------------
def test_prefill_time_is_the_step_cost_of_the_uncached_prompt():
    for n in (10, 100, 500):
        _, seq = run_one(TINY, prompt(n))
        assert ttft(seq) == pytest.approx(TINY.step_s(n, n), rel=1e-12)


def test_prefill_time_grows_linearly_with_uncached_tokens():
    p = profile(max_num_batched_tokens=4096)
    t = {n: ttft(run_one(p, prompt(n))[1]) for n in (1000, 2000, 3000)}
    # equal increments: fixed costs cancel, each 1,000 tokens adds compute + their KV reads
    step = p.compute_s(1000) + p.kv_bytes_per_token * 1000 / (p.hbm_bytes_per_s * p.bandwidth_efficiency)
    assert t[2000] - t[1000] == pytest.approx(step, rel=1e-9)
    assert t[3000] - t[2000] == pytest.approx(step, rel=1e-9)


def test_chunked_prefill_splits_a_long_prompt_over_budget_sized_steps():
    p = profile(max_num_batched_tokens=512)
    _, seq = run_one(p, prompt(1200))
    expected = p.step_s(512, 512) + p.step_s(512, 1024) + p.step_s(176, 1200)
    assert ttft(seq) == pytest.approx(expected, rel=1e-12)


def test_request_overhead_delays_scheduling():
    p = profile(request_overhead_s=0.01)
    _, seq = run_one(p, prompt(50))
    assert seq.queue_s == pytest.approx(0.01)
    assert ttft(seq) == pytest.approx(0.01 + p.step_s(50, 50))


# --- decode ------------------------------------------------------------------------------------
def itl(seq) -> list[float]:
    t = seq.token_times_s
    return [b - a for a, b in itertools.pairwise(t)]


def test_decode_step_time_grows_with_batch_size():
    gaps = {}
    for batch in (1, 4, 8):
        engine = Engine(TINY)
        seqs = simulate(engine, [Arrival(0.0, f"r{i}", prompt(32, i), 20) for i in range(batch)])
        s = seqs["r0"]
        # steady decode: every sequence in the batch decodes one token per step
        ctx = 33 * batch  # each reads its 32 prompt tokens and 1 generated token
        assert itl(s)[0] == pytest.approx(TINY.step_s(batch, ctx), rel=1e-9)
        gaps[batch] = itl(s)[5]
    assert gaps[1] < gaps[4] < gaps[8]


def test_decode_step_time_grows_with_context():
    short = run_one(TINY, prompt(16), max_tokens=10)[1]
    long = run_one(TINY, prompt(3000), max_tokens=10)[1]
    assert itl(long)[0] > itl(short)[0]
    # exactly the extra KV bytes read
    extra = TINY.kv_bytes_per_token * (3001 - 17) / (TINY.hbm_bytes_per_s * TINY.bandwidth_efficiency)
    assert itl(long)[0] - itl(short)[0] == pytest.approx(extra, rel=1e-9)


def test_max_tokens_is_honoured_exactly():
    for m in (1, 2, 37):
        _, seq = run_one(TINY, prompt(20), max_tokens=m)
        assert seq.generated == m
        assert len(seq.token_times_s) == m
        assert len(seq.words) == m


# --- batching ----------------------------------------------------------------------------------
def test_two_concurrent_requests_share_steps():
    engine = Engine(TINY)
    seqs = simulate(engine, [Arrival(0.0, "a", prompt(64, 1), 10), Arrival(0.0, "b", prompt(64, 2), 10)])
    a, b = seqs["a"], seqs["b"]
    assert a.token_times_s == b.token_times_s  # same steps, same ends
    alone = run_one(TINY, prompt(64, 1), max_tokens=10)[1]
    together_span = a.token_times_s[-1] - a.arrival_s
    alone_span = alone.token_times_s[-1] - alone.arrival_s
    assert together_span < 1.2 * alone_span  # far less than two requests back to back


def test_a_request_arriving_mid_step_joins_the_next_step():
    engine = Engine(TINY)
    first_step = TINY.step_s(64, 64)
    seqs = simulate(engine, [Arrival(0.0, "a", prompt(64, 1), 10), Arrival(first_step / 2, "b", prompt(64, 2), 10)])
    assert seqs["b"].scheduled_s == pytest.approx(first_step)
    # a keeps decoding while b prefills: a emits a token at the end of every step
    assert seqs["a"].token_times_s[1] == pytest.approx(seqs["b"].first_token_s)


def test_slots_bound_the_batch_and_the_rest_wait():
    p = profile(max_num_seqs=2)
    engine = Engine(p)
    seqs = simulate(engine, [Arrival(0.0, f"r{i}", prompt(16, i), 5) for i in range(3)])
    first_done = min(seqs["r0"].finished_s, seqs["r1"].finished_s)
    assert seqs["r2"].scheduled_s == pytest.approx(first_done)
    assert seqs["r2"].queue_s > 0


def test_decode_tokens_count_against_the_step_budget():
    p = profile(max_num_batched_tokens=100, max_num_seqs=8)
    engine = Engine(p)
    engine.add("a", prompt(16, 1), 50, arrival_s=0.0)
    engine.step()  # a prefilled, now decoding
    engine.add("b", prompt(500, 2), 5, arrival_s=engine.now)
    step = engine.step()
    assert step.num_tokens == 100  # 1 decode token + 99 prompt tokens of b
    assert step.num_seqs == 2


# --- prefix cache ------------------------------------------------------------------------------
def test_a_cache_hit_cuts_prefill():
    engine, cold = run_one(TINY, prompt(1000, 7))
    engine, warm = run_one(TINY, prompt(1000, 7), engine=engine)
    assert cold.cached_tokens == 0
    assert warm.cached_tokens == 1000 // 16 * 16
    assert ttft(warm) == pytest.approx(TINY.step_s(1000 - warm.cached_tokens, 1000))
    assert ttft(warm) < ttft(cold) / 2
    assert engine.stats.prefix_cache_hits == warm.cached_tokens
    assert engine.stats.prefix_cache_queries == 2000


def test_at_least_one_prompt_token_is_computed_on_a_full_hit():
    engine, _ = run_one(TINY, prompt(320, 3))  # exactly 20 blocks
    _, warm = run_one(TINY, prompt(320, 3), engine=engine)
    assert warm.cached_tokens == 304  # the last block is recomputed


def test_the_next_turn_hits_on_prompt_plus_reply():
    engine, turn1 = run_one(TINY, prompt(200, 4), max_tokens=40)
    reply_ids = [WORD_TOKEN_IDS[w] for w in turn1.words]
    turn2_prompt = prompt(200, 4) + reply_ids + prompt(30, 99)
    _, turn2 = run_one(TINY, turn2_prompt, engine=engine)
    # every full block of prompt + reply whose KV was computed (all but the last reply token)
    assert turn2.cached_tokens == (200 + 40 - 1) // 16 * 16


def test_lru_eviction_at_capacity_evicts_the_oldest_tail_first():
    p = profile(kv_capacity_tokens=64 * 16, max_model_len=1024)
    engine = Engine(p)
    prompts = {name: prompt(320, i) for i, name in enumerate("ABCD")}
    for name in "ABC":  # one after another: 20 cached blocks each, 60 of 64 blocks
        run_one(p, prompts[name], max_tokens=16, engine=engine)
    assert engine.cache.cached_blocks == 60
    assert engine.cache.evictions == 0
    run_one(p, prompts["D"], max_tokens=16, engine=engine)  # needs 21 blocks: 4 free + 17 evicted
    assert engine.cache.evictions == 17
    match = {k: engine.cache.match(block_hashes(v, 16)) for k, v in prompts.items()}
    assert match == {"A": 3, "B": 20, "C": 20, "D": 20}  # A, the oldest, lost its tail


def test_blocks_of_running_sequences_are_pinned():
    p = profile(kv_capacity_tokens=64 * 16, max_model_len=1024, max_num_seqs=8)
    engine = Engine(p)
    seqs = simulate(engine, [Arrival(0.0, "x", prompt(600, 1), 40), Arrival(0.0, "y", prompt(600, 2), 40)])
    x, y = seqs["x"], seqs["y"]
    # each needs 40 of the 64 blocks: y can't evict x's pinned blocks, so it waits for x to finish
    assert y.scheduled_s == pytest.approx(x.finished_s)
    # x left 39 cached blocks (600 + 39 tokens with KV); y's 40 blocks took 25 free + 15 evicted
    assert engine.cache.evictions == 15


def test_kv_usage_counts_blocks_held_by_running_sequences():
    engine = Engine(TINY)
    engine.add("a", prompt(100), 28, arrival_s=0.0)
    engine.step()
    assert engine.cache.used_blocks == math.ceil(128 / 16)
    while engine.has_work():
        engine.step()
    assert engine.cache.used_blocks == 0
    assert engine.cache.usage() == 0.0


# --- admission ---------------------------------------------------------------------------------
def test_queue_full_raises_and_counts_a_rejection():
    p = profile(max_num_seqs=1, max_waiting=2)
    engine = Engine(p)
    engine.add("a", prompt(16, 1), 100, arrival_s=0.0)
    engine.step()  # a is running
    engine.add("b", prompt(16, 2), 5)
    engine.add("c", prompt(16, 3), 5)
    with pytest.raises(QueueFull):
        engine.add("d", prompt(16, 4), 5)
    assert engine.stats.rejected == 1
    assert engine.num_waiting == 2 and engine.num_running == 1


def test_simulate_reports_rejections_as_none():
    p = profile(max_num_seqs=1, max_waiting=1)
    seqs = simulate(Engine(p), [Arrival(0.0, f"r{i}", prompt(16, i), 5) for i in range(3)])
    assert seqs["r0"] is not None and seqs["r1"] is None and seqs["r2"] is None


def test_too_long_requests_are_refused():
    engine = Engine(TINY)
    with pytest.raises(RequestTooLong):
        engine.add("a", prompt(4000), 200)
    with pytest.raises(RequestTooLong):
        engine.add("b", [], 10)


def test_abort_frees_the_slot_and_blocks():
    engine = Engine(TINY)
    seq = engine.add("a", prompt(100), 50, arrival_s=0.0)
    engine.step()
    engine.abort(seq)
    assert not engine.has_work()
    assert engine.cache.used_blocks == 0
    waiting = engine.add("b", prompt(10), 5)
    engine.abort(waiting)
    assert engine.num_waiting == 0


# --- determinism -------------------------------------------------------------------------------
def workload(n=30):
    rng = random.Random(5)
    t = 0.0
    out = []
    for i in range(n):
        t += rng.expovariate(200)
        out.append(Arrival(t, f"r{i}", prompt(rng.randrange(10, 400), rng.randrange(4)), rng.randrange(1, 30)))
    return out


def test_same_seed_same_everything():
    a = simulate(Engine(TINY, seed=3), workload())
    b = simulate(Engine(TINY, seed=3), workload())
    assert [(s.token_times_s, s.words, s.cached_tokens) for s in a.values()] == [
        (s.token_times_s, s.words, s.cached_tokens) for s in b.values()
    ]


def test_reply_depends_on_seed_and_prompt():
    w = lambda seed, salt: run_one(TINY, prompt(50, salt), 20, Engine(TINY, seed=seed))[1].words  # noqa: E731
    assert w(1, 1) == w(1, 1)
    assert w(1, 1) != w(2, 1)
    assert w(1, 1) != w(1, 2)


# --- calibration of the shipped profiles ---------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "decode_tok_s"), [("laptop-qwen2.5-1.5b-q4", 176.5), ("laptop-qwen2.5-1.5b-f16", 75.8)]
)
def test_laptop_profiles_reproduce_their_calibration_targets(name, decode_tok_s):
    p = load_profile(name)
    ids = prompt(2600, 11)
    engine, cold = run_one(p, ids, max_tokens=2)
    engine.now += 1.0
    _, warm = run_one(p, ids, max_tokens=2, engine=engine)
    assert 0.43 <= ttft(cold) <= 0.45
    assert 26 <= ttft(cold) / ttft(warm) <= 48
    _, short = run_one(p, prompt(64, 12), max_tokens=129)
    rate = 128 / (short.token_times_s[-1] - short.token_times_s[0])
    assert rate == pytest.approx(decode_tok_s, rel=0.01)


def test_h200_profile_is_in_a_plausible_range():
    p = load_profile("h200-llama3-8b-fp8")
    _, seq = run_one(p, prompt(64), max_tokens=65)
    rate = 64 / (seq.token_times_s[-1] - seq.token_times_s[0])
    assert 250 < rate < 400  # batch-1 decode of an FP8 8B model on one H200
    prefill_tok_s = 8192 / p.compute_s(8192)
    assert 30_000 < prefill_tok_s < 60_000
