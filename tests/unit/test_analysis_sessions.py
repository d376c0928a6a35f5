"""Task time, agent overhead and step kinds from request records (analysis.sessions)."""

from __future__ import annotations

from analysis.records import RequestRecord
from analysis.sessions import session_stats, session_times, step_kind_stats


def rec(sid, step, kind, send, last, end, *, steps=3, ok=True, first=None) -> RequestRecord:
    return RequestRecord(
        request_id=f"{sid}-{step}", session_id=sid, session_index=0, turn_index=0,
        turn_class="first" if kind == "first" else "follow-up", tenant="t", target="x", worker="w",
        status="ok" if ok else "error", t_sched_us=send, t_send_us=send,
        t_first_us=first if first is not None else send + 10, t_last_us=last, t_end_us=end,
        output_tokens=2, chunks=2, itl_us=[last - send - 10], step_id=step, step_kind=kind, session_steps=steps,
    )  # fmt: skip


# A parent 0-100 µs, two overlapping children 150-400 and 160-500, a join at 600-900: task time
# 0..880 (last token), model time 100 + 350 (the children's union) + 280 = 730, overhead 150.
FAN = [
    rec("a", "p", "first", 0, 90, 100, steps=4),
    rec("a", "c0", "fan-out child", 150, 390, 400, steps=4),
    rec("a", "c1", "fan-out child", 160, 480, 500, steps=4),
    rec("a", "j", "join", 600, 880, 900, steps=4),
]


def test_task_time_and_overhead_count_concurrent_children_once():
    (t,) = session_times(FAN)
    assert (t.session_id, t.requests, t.task_time_us, t.model_time_us, t.agent_overhead_us) == ("a", 4, 880, 730, 150)


def test_only_complete_successful_sessions_have_a_task_time():
    cut = [rec("b", "p", "first", 0, 50, 60, steps=2)]  # 1 of 2 steps recorded
    failed = [rec("c", "p", "first", 0, 50, 60, steps=2), rec("c", "q", "follow-up", 70, 80, 90, steps=2, ok=False)]
    legacy = [rec("d", "p", "first", 0, 50, 60, steps=None), rec("d", "q", "follow-up", 70, 80, 90, steps=None)]
    times = session_times([*FAN, *cut, *failed, *legacy])
    assert [(t.session_id, t.task_time_us, t.agent_overhead_us) for t in times] == [("a", 880, 150), ("d", 80, 10)]


def test_sessions_with_an_unmeasured_request_are_left_out_and_step_kinds_group_records():
    other = [rec("e", "p", "first", 0, 40, 50, steps=1)]
    stats = session_stats(measured=FAN, all_records=[*FAN, *other])
    assert (stats.measured, stats.complete) == (1, 1)
    assert stats.task_time.get_total_count() == 1 and stats.task_time.get_max_value() == 880
    assert stats.agent_overhead_share == round(150 / 880, 6)
    kinds = step_kind_stats(FAN)
    assert list(kinds) == ["first", "fan-out child", "join"]
    child = kinds["fan-out child"]
    assert (child.requests, child.errors, child.histograms["ttft"].get_total_count()) == (2, 0, 2)
    # A record from before DAG sessions falls back to its turn class.
    old = rec("f", "p", "first", 0, 40, 50)
    old.step_kind = None
    old.turn_class = "follow-up"
    assert list(step_kind_stats([old])) == ["follow-up"]
