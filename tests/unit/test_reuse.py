"""The LRU stack-distance model of prefix reuse (workloads.reuse, workloads.prompt_blocks).

Hand-checked sequences, and random request streams checked against a plain LRU cache of each
capacity (an OrderedDict, one entry per block) that shares no code with the model.
"""

from __future__ import annotations

import random
from collections import OrderedDict

import pytest

from workloads.prompt_blocks import SessionReuse, head_blocks
from workloads.reuse import Group, ReuseCounter
from workloads.shapes import SessionShape, TurnShape


def test_a_hand_checked_sequence_of_shared_blocks():
    # r1 = [a, b], r2 = [c], r3 = [a, b], one token per block. After r1 an LRU holds a (most
    # recent: the head is touched last) then b; r2 adds c; at r3, a is 1 block deep, b 2.
    c = ReuseCounter(block_size=1)
    c.request([("a", 1), ("b", 1)], (), 2, None, 0)
    c.request([("c", 1)], (), 1, None, 0)
    c.request([("a", 1), ("b", 1)], (), 2, None, 0)
    curve = c.curve()
    assert [curve.hit_tokens(cap) for cap in (1, 2, 3, None)] == [0, 1, 2, 2]
    assert curve.prompt_tokens == 5 and curve.hit_rate(None) == pytest.approx(2 / 5)
    assert curve.working_set_blocks == 3
    assert curve.capacity_for(0.5) == 2 and curve.capacity_for(1.0) == 3


def test_a_private_request_ages_the_cache_without_a_lookup():
    c = ReuseCounter(block_size=4)
    c.request([("a", 4)], (), 4, None, 0)
    c.add_private(40, 10)  # ten blocks nobody will hit
    c.request([("a", 4)], (), 4, None, 0)
    curve = c.curve()
    assert curve.hit_tokens(10) == 0 and curve.hit_tokens(11) == 4
    assert curve.prompt_tokens == 48


def test_two_interleaved_conversations_need_both_histories_in_the_cache():
    # Each session: a 40-token private first message with a 10-token reply (3 full blocks of 16
    # cached), then 1 s later an 8-token follow-up that hits those 3 blocks (48 tokens). Session 1
    # arrives at 0.5 s, so by session 0's follow-up its 3 blocks are more recent.
    def shape(index: int) -> SessionShape:
        return SessionShape(
            index=index, tenant="default", system=(),
            turns=(TurnShape(40, 10), TurnShape(8, 5, think_time_s=1.0, parents=(0,), kind="follow-up")),
        )  # fmt: skip

    r = SessionReuse(block_size=16)
    r.add(shape(0), 0.0)
    r.add(shape(1), 0.5)
    curve = r.curve()
    assert curve.prompt_tokens == 2 * (40 + 58)
    assert curve.hit_tokens(None) == 2 * 48
    # Session 0's follow-up sits under session 1's 3 blocks; session 1's under session 0's 3+0.
    assert curve.hit_tokens(6) == 2 * 48
    assert curve.hit_tokens(4) == 16 + 16
    assert curve.hit_tokens(3) == 0


def test_sessions_with_one_system_prompt_share_its_full_blocks_and_its_last_partial_one():
    system = ((("sys", "t"), 40),)  # 2 full blocks of 16 and 8 tokens
    blocks = head_blocks(system, 16)
    assert [n for _, n in blocks] == [16, 16, 8]
    other = head_blocks(((("sys", "t"), 20),), 16)  # a shorter prompt of the same tenant: a prefix
    assert other[0] == blocks[0] and other[1][0] == blocks[1][0] and other[1][1] == 4
    r = SessionReuse(block_size=16)
    for k in range(3):
        r.add(SessionShape(k, "t", (), (TurnShape(40, 1, pieces=system),)), float(k))
    assert r.curve().hit_tokens(None) == 2 * 40


@pytest.mark.parametrize(("seed", "requests_n"), [(0, 60), (1, 60), (2, 60), (3, 60), (4, 60), (5, 1000)])
def test_the_model_is_an_lru_cache_at_every_capacity(seed, requests_n):
    # 1000 requests touch ~4k positions: the index grows past its first 1024 and 2048 meanwhile.
    rng = random.Random(seed)
    B = 4
    requests = []  # (shared [(key, tokens)], ancestors, prompt_tokens, new group or None, new blocks)
    # Open conversations: the shared head every step of it sends (a path in a small trie of
    # block keys, so a key always has the same blocks before it) and its private groups so far.
    contexts: list[tuple[list, list[Group]]] = []
    for i in range(requests_n):
        if contexts and rng.random() < 0.5:
            shared, ancestors = contexts[rng.randrange(len(contexts))]
        else:
            path = [rng.randint(0, 1) for _ in range(rng.randint(0, 4))]
            shared, ancestors = [(tuple(path[: d + 1]), B) for d in range(len(path))], []
        n_new = rng.randint(0, 3)
        keep = rng.random() < 0.7
        new = Group(("g", i), n_new) if keep else None
        prompt = B * (len(shared) + sum(g.blocks for g in ancestors)) + rng.randint(1, 6)
        requests.append((shared, tuple(ancestors), prompt, new, n_new))
        if new is not None:
            contexts.append((shared, [*ancestors, new]))
    model = ReuseCounter(B)
    for req in requests:
        model.request(*req)
    curve = model.curve()
    for capacity in (1, 2, 3, 5, 8, 13, 21, 34, 1000):
        assert curve.hit_tokens(capacity) == _plain_lru_hits(requests, capacity, B), capacity
    assert curve.hit_tokens(None) == _plain_lru_hits(requests, 10**9, B)


def _plain_lru_hits(requests, capacity: int, block_size: int) -> int:
    cache: OrderedDict = OrderedDict()  # block -> None, least recent first
    hits = 0
    unique = 0
    for shared, ancestors, _prompt, new, n_new in requests:
        blocks = [(key, n) for key, n in shared]
        for g in ancestors:
            blocks += [((g.group_id, j), block_size) for j in range(g.blocks)]
        for key, n in blocks:  # leading blocks that are cached
            if key not in cache:
                break
            hits += n
        if new is not None:
            tail = [(new.group_id, j) for j in range(new.blocks)]
        else:
            tail = [("unique", unique + j) for j in range(n_new)]
            unique += n_new
        touched = [key for key, _ in blocks] + tail
        for key in reversed(touched):  # tail first: the head ends most recent
            cache.pop(key, None)
            cache[key] = None
            if len(cache) > capacity:
                cache.popitem(last=False)
    return hits
