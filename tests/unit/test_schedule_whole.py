"""Traces and session files run whole; what cuts them is said; what cannot be asked for is refused.

The Mooncake fixture spans 283 s: the default 60 s duration used to cut it to a quarter, silently.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import pytest

from loadgen.engine.driver import global_schedule, share_indices
from loadgen.errors import UserError
from loadgen.runtime.accounting import Accounting
from loadgen.runtime.locust_options import add_arguments, config_from_options
from loadgen.runtime.run_workload import config_workload

MOONCAKE = Path(__file__).resolve().parent.parent / "fixtures" / "datasets" / "mooncake.jsonl"


def _cfg(*args: str):
    class Parser(argparse.ArgumentParser):
        def add_argument(self, *a, include_in_web_ui=True, **k):
            return super().add_argument(*a, **k)

    p = Parser()
    p.add_argument("--host", default="")
    add_arguments(p)
    return config_from_options(p.parse_args(["--host", "http://127.0.0.1:9", *args]))


def test_a_trace_runs_whole_by_default_and_at_any_time_scale() -> None:
    for scale in ("1", "0.5"):
        cfg = _cfg("--workload", str(MOONCAKE), "--trace-time-scale", scale)
        assert cfg.arrival == "trace" and cfg.duration_s is None and cfg.num_sessions is None
        sched = global_schedule(cfg, config_workload(cfg))
        assert len(sched.offsets) == 240 and sched.available == 240 and sched.cut_by == []
        assert sched.offsets[-1] == pytest.approx((282761 - 458) / 1000 * float(scale), rel=1e-6)


def test_a_cut_trace_says_what_cut_it() -> None:
    cfg = _cfg("--workload", str(MOONCAKE), "--duration", "60s")
    sched = global_schedule(cfg, config_workload(cfg))
    assert 0 < len(sched.offsets) < 240 and sched.cut_by == ["--duration"]
    acc = Accounting.plan(cfg, sched, config_workload(cfg))
    assert acc.line().startswith(f"loadgen accounting: {len(sched.offsets)} sessions planned (of 240 in the workload; cut by --duration)")
    cfg = _cfg("--workload", str(MOONCAKE), "--num-sessions", "20")
    assert global_schedule(cfg, config_workload(cfg)).cut_by == ["--num-sessions"]


def test_more_sessions_than_the_workload_holds_is_a_usage_error() -> None:
    with pytest.raises(UserError) as e:
        _cfg("--workload", str(MOONCAKE), "--num-sessions", "20000")
    assert str(e.value.message) == (
        "--num-sessions 20000: the workload holds only 240 sessions; ask for at most 240, "
        "or leave --num-sessions out to replay it whole"
    )


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_a_time_scale_that_is_not_a_positive_number_is_a_usage_error(value: str) -> None:
    with pytest.raises(UserError) as e:
        _cfg("--workload", str(MOONCAKE), "--trace-time-scale", value)
    assert str(e.value.message).startswith(f"--trace-time-scale {float(value):g}: must be a number above 0")


def test_a_generated_workload_still_runs_the_default_sixty_seconds() -> None:
    assert _cfg("--workload", "tiny").duration_s == 60.0


def test_shares_of_a_re_planned_slot_are_disjoint_and_cover_it_once() -> None:
    n_slots, length = 3, 1000
    lost = set(share_indices(length, n_slots, 1).tolist())
    # Slot 1 split over 2 survivors, then survivor 0's part split again over 3.
    parts = [share_indices(length, n_slots, 1, [[2, 1]])]
    parts += [share_indices(length, n_slots, 1, [[2, 0], [3, j]]) for j in range(3)]
    union = np.concatenate(parts)
    assert len(union) == len(set(union.tolist())) == len(lost) and set(union.tolist()) == lost
    assert all(k % n_slots == 1 for k in union)


def test_accounting_settles_sessions_lost_with_a_worker_and_stopped_early() -> None:
    cfg = _cfg("--workload", "tiny", "--rate", "10", "--num-sessions", "100")
    sched = global_schedule(cfg, config_workload(cfg))
    acc = Accounting.plan(cfg, sched, config_workload(cfg))
    acc.n_slots = 2
    from loadgen.runtime.accounting import Share

    # Worker w1 held slot 1 and was lost; its arrivals went to w0 from 4 s on.
    cut_s = 4.0
    due_w1 = int(np.count_nonzero(sched.offsets[share_indices(100, 2, 1)] < cut_s))
    acc.close(started_by_worker={"w0": 70, "w1": due_w1 - 5}, lost_shares={"w1": [Share(1, [], 0.0, cut_s)]}, aborted=False)
    assert acc.sessions_not_started == {"worker lost": 5, "not sent by any worker": 100 - 70 - (due_w1 - 5) - 5}
    acc.close(started_by_worker={"w0": 40, "w1": due_w1}, lost_shares={}, aborted=True)
    assert acc.sessions_not_started == {"stopped early": 100 - 40 - due_w1}
    assert not math.isnan(acc.as_dict()["arrivals_planned"])
