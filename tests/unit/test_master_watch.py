"""The worker's watch on its master's heartbeats: counted checks, not wall time."""

from __future__ import annotations

from types import SimpleNamespace

from loadgen.runtime.master_watch import MISSED_CHECKS_LIMIT, MasterWatch


def _watch(limit: int = MISSED_CHECKS_LIMIT) -> MasterWatch:
    env = SimpleNamespace(events=SimpleNamespace())
    return MasterWatch(env, on_master_lost=lambda _s: None, missed_limit=limit)


def test_nothing_counts_before_the_first_heartbeat() -> None:
    w = _watch()
    assert not any(w.check() for _ in range(3 * MISSED_CHECKS_LIMIT))
    assert w.missed == 0


def test_the_master_is_lost_after_the_limit_of_silent_checks_in_a_row() -> None:
    w = _watch(limit=5)
    w._on_heartbeat()
    assert w.check() is False  # heard since the last check
    assert [w.check() for _ in range(5)] == [False, False, False, False, True]


def test_a_heartbeat_starts_the_count_over() -> None:
    w = _watch(limit=3)
    w._on_heartbeat()
    w.check()
    assert [w.check(), w.check()] == [False, False]
    w._on_heartbeat()
    assert [w.check(), w.check(), w.check()] == [False, False, False]
    assert w.check() is True
