"""The block pool and hash chain of the sim's prefix cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from targets.sim.prefix_cache import PrefixCache, block_hashes


def test_hash_chain_identifies_a_block_by_its_whole_prefix():
    a = block_hashes(list(range(64)), 16)
    assert len(a) == 4
    assert block_hashes(list(range(70)), 16) == a  # the partial 5th block has no hash
    changed = block_hashes([999, *range(1, 64)], 16)
    assert all(x != y for x, y in zip(a, changed, strict=True))  # first block differs -> all differ
    same_head = block_hashes([*range(32), *range(100, 132)], 16)
    assert same_head[:2] == a[:2] and same_head[2:] != a[2:]


def test_hashes_are_stable_across_processes():
    # A block's id must not depend on the interpreter's hash salt: two processes started with
    # different PYTHONHASHSEED values compute the same chain as this one.
    tokens, size = list(range(40)), 8
    here = block_hashes(tokens, size)
    assert len(here) == 5 and all(isinstance(h, int) for h in here)
    code = (
        "import json, sys; from targets.sim.prefix_cache import block_hashes; "
        f"print(json.dumps(block_hashes({tokens!r}, {size})))"
    )
    root = Path(__file__).resolve().parents[2]
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout) == here, f"PYTHONHASHSEED={seed}"


def test_reserve_commit_release_and_lru_order():
    pool = PrefixCache(num_blocks=4, block_size=16)
    assert pool.reserve([], 2)
    pool.commit(101)
    pool.commit(102)
    assert pool.used_blocks == 2 and pool.cached_blocks == 2
    pool.release([101, 102], 0)  # unpinned tail first: 102 is older on the LRU list than 101
    assert pool.used_blocks == 0 and pool.cached_blocks == 2
    assert pool.reserve([], 3)  # 2 free + 1 evicted: the tail (102) goes first
    assert pool.evictions == 1
    assert 101 in pool and 102 not in pool


def test_pinned_blocks_are_never_evicted():
    pool = PrefixCache(num_blocks=3, block_size=16)
    assert pool.reserve([], 2)
    pool.commit(1)
    pool.commit(2)  # both pinned by a running sequence
    assert not pool.reserve([], 2)  # only 1 free; pinned blocks can't be evicted
    assert pool.reserve([], 1)
    assert pool.evictions == 0


def test_hits_pinned_by_a_reservation_are_not_counted_as_evictable():
    pool = PrefixCache(num_blocks=2, block_size=16)
    pool.reserve([], 2)
    pool.commit(7)
    pool.commit(8)
    pool.release([7, 8], 0)
    # pinning both cached blocks leaves nothing to evict for a private block
    assert not pool.can_reserve([7, 8], 1)
    assert pool.can_reserve([7], 1)
    assert pool.reserve([7], 1)
    assert 7 in pool and 8 not in pool


def test_commit_of_an_already_cached_block_shares_it():
    pool = PrefixCache(num_blocks=4, block_size=16)
    pool.reserve([], 1)
    pool.commit(5)
    pool.reserve([], 1)
    pool.commit(5)  # a second sequence computed the same block
    assert pool.cached_blocks == 1 and pool.private_blocks == 0
    pool.release([5], 0)
    assert pool.used_blocks == 1  # still pinned by the other
    pool.release([5], 0)
    assert pool.used_blocks == 0


def test_match_counts_leading_cached_blocks():
    pool = PrefixCache(num_blocks=8, block_size=16)
    pool.reserve([], 2)
    pool.commit(1)
    pool.commit(2)
    assert pool.match([1, 2, 3]) == 2
    assert pool.match([2, 1]) == 2
    assert pool.match([3, 1]) == 0


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError):
        PrefixCache(0, 16)
