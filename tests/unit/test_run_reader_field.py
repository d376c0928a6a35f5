"""run.json ``reader`` from the states the workers report (loadgen/runtime/run_record.py)."""

from __future__ import annotations

from loadgen.runtime.run_record import reader_used


def test_one_reader_for_every_worker_is_named_once() -> None:
    assert reader_used({"a": {"reader": "compiled"}, "b": {"reader": "compiled"}}) == {"reader": "compiled"}


def test_workers_that_disagree_make_a_mixed_run_with_each_named() -> None:
    states = {"w2": {"reader": "python"}, "w1": {"reader": "compiled"}, "w3": {}}
    assert reader_used(states) == {"reader": "mixed", "reader_by_worker": {"w1": "compiled", "w2": "python"}}


def test_no_worker_reported_is_null() -> None:
    assert reader_used({}) == {"reader": None}
    assert reader_used({"old": {"cpu_s": 1.0}}) == {"reader": None}
