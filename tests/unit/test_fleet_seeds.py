"""Replica seeds derive from the fleet seed."""

from __future__ import annotations

from targets.fleet.fleet import replica_seed


def test_replica_seeds_are_fixed_distinct_and_in_range():
    seeds = [replica_seed(7, i) for i in range(8)]
    assert seeds == [replica_seed(7, i) for i in range(8)]
    assert len(set(seeds)) == 8
    assert all(0 <= s < 2**31 for s in seeds)
    assert replica_seed(8, 0) not in seeds
