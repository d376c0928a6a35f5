"""A saturated generator names the cause it measured, and the default bounds follow from what the lag
would distort (analysis/generator_health.py, loadgen/engine/health.py, loadgen/runtime/verdict.py).

Pure functions over measured figures: no processes, no timing.
"""

from __future__ import annotations

import pytest

from analysis import generator_health as gh
from analysis.summary import _generator
from loadgen.engine import health
from loadgen.engine.health import (
    Counters,
    cpu_figures,
    merge_cpu,
    parse_psi,
    parse_stat,
    read_counters,
    worker_cpu,
)
from loadgen.runtime.verdict import EXIT_GENERATOR_SATURATED, verdict_from_summary

PSI = "some avg10=45.20 avg60=30.00 avg300=5.00 total=3550744\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
STAT = "cpu  3399 0 1856 81839 310 0 30 56 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n"


# ---- what a worker reads -----------------------------------------------------------------------


def test_the_counters_parse_and_each_absent_one_is_none(tmp_path, monkeypatch) -> None:
    assert parse_psi(PSI) == (45.2, 3550744)
    assert parse_psi("full avg10=1 total=2\n") is None
    assert parse_psi("some avg10=x total=1") is None
    assert parse_stat(STAT) == (56, 3399 + 1856 + 81839 + 310 + 30 + 56)
    assert parse_stat("cpu  1 2 3\n") is None  # an old kernel's short line
    assert parse_stat("intr 5\n") is None
    monkeypatch.setattr(health, "PSI_PATH", str(tmp_path / "no-psi"))
    monkeypatch.setattr(health, "STAT_PATH", str(tmp_path / "no-stat"))
    c = read_counters()
    assert (c.psi_some_us, c.psi_some_avg10, c.steal, c.ticks) == (None, None, None, None)
    assert c.cpu_ns >= 0 and c.nivcsw is not None  # getrusage is everywhere this runs
    (tmp_path / "psi").write_text(PSI)
    monkeypatch.setattr(health, "PSI_PATH", str(tmp_path / "psi"))
    assert read_counters().psi_some_avg10 == 45.2


def _counters(t_s: float, cpu_s: float, nivcsw=0, psi_us=0, avg10=0.0, steal=0, ticks=0) -> Counters:
    return Counters(int(t_s * 1e9), int(cpu_s * 1e9), nivcsw, psi_us, avg10, steal, ticks)


def test_a_workers_figures_are_deltas_over_its_run_as_shares_and_rates() -> None:
    first = _counters(100.0, 1.0, nivcsw=10, psi_us=1_000_000, avg10=2.0, steal=5, ticks=1000)
    last = _counters(110.0, 1.4, nivcsw=510, psi_us=5_000_000, avg10=40.0, steal=55, ticks=3000)
    fig = cpu_figures(first, last, worst_interval_share=0.12, avg10_max=47.5, late_wakes=30, late_ns=int(0.6e9),
                      late_cpu_ns=int(0.03e9))  # fmt: skip
    assert fig["wall_s"] == 10.0 and fig["cpu_s"] == 0.4
    assert (fig["involuntary_switches"], fig["pressure_some_s"], fig["steal_share"]) == (500, 4.0, 0.025)
    assert fig["pressure_some_avg10_max"] == 47.5
    w = worker_cpu(fig)
    assert w["cpu_share"] == 0.04 and w["worst_interval_share"] == 0.12
    assert w["while_late_share"] == 0.05  # late 0.6 s, of which it ran 0.03 s: it was not running
    assert (w["involuntary_switches_per_s"], w["pressure_some_share"], w["steal_share"]) == (50.0, 0.4, 0.025)
    # Too little late time to say anything about it; counters this system lacks stay None.
    bare = cpu_figures(Counters(0, 0, None, None, None, None, None), Counters(int(2e9), int(1e9), None, None, None, None, None),
                       late_wakes=1, late_ns=int(0.02e9), late_cpu_ns=int(0.02e9))  # fmt: skip
    w = worker_cpu(bare)
    assert w["cpu_share"] == 0.5 and w["while_late_share"] is None
    assert w["involuntary_switches_per_s"] is None and w["pressure_some_share"] is None and w["steal_share"] is None


def test_over_workers_each_figure_is_the_worst_workers() -> None:
    a = {"cpu_share": 0.9, "worst_interval_share": 0.95, "while_late_share": None, "late_wakes": 3,
         "involuntary_switches_per_s": 2.0, "pressure_some_share": None, "pressure_some_avg10_max": None,
         "steal_share": 0.0}  # fmt: skip
    b = {**a, "cpu_share": 0.2, "while_late_share": 0.1, "late_wakes": 4, "pressure_some_share": 0.3}
    m = merge_cpu([a, b])
    assert (m["cpu_share"], m["while_late_share"], m["pressure_some_share"], m["late_wakes"]) == (0.9, 0.1, 0.3, 7)
    assert m["pressure_some_avg10_max"] is None


def test_a_workers_state_carries_its_cpu_figures_and_they_merge_into_run_json() -> None:
    h = health.GeneratorHealth()
    st = h.state(max_age_s=0.0)
    assert st["chunks"] == {"token_chunks": 0, "coalesced": 0}
    assert {"wall_s", "cpu_s", "worst_interval_share", "late_wakes", "involuntary_switches", "pressure_some_s",
            "pressure_some_avg10_max", "steal_share"} <= set(st["cpu"])  # fmt: skip
    out = health.summarize({"w0": {"health": st}, "w1": {"health": st}})
    assert set(out["cpu"]["by_worker"]) == {"w0", "w1"} and out["cpu"]["interval_s"] == health.SAMPLE_S


# ---- the default bounds ------------------------------------------------------------------------


def _bounds(**kw) -> gh.Bounds:
    args = {"explicit_ms": None, "run_bound_ms": 10.0, "run_explicit": False, "arrival_gap_mean_ms": None,
            "itl_p50_ms": None}  # fmt: skip
    return gh.bounds(**{**args, **kw})


def test_the_schedule_bound_is_a_tenth_of_the_mean_arrival_gap_within_floor_and_ceiling() -> None:
    assert _bounds(arrival_gap_mean_ms=200.0).schedule_ms == 20.0  # 5/s
    assert _bounds(arrival_gap_mean_ms=20.0).schedule_ms == 10.0  # 50/s: the floor
    assert _bounds(arrival_gap_mean_ms=10_000.0).schedule_ms == 100.0  # 0.1/s: the ceiling
    assert _bounds().schedule_ms == 10.0  # one request: no gap
    assert _bounds(run_bound_ms=None, arrival_gap_mean_ms=50.0).schedule_ms == gh.DEFAULT_FLOOR_MS
    b = _bounds(arrival_gap_mean_ms=200.0)
    assert b.source == "rule" and b.to_dict()["arrival_gap_fraction"] == 0.1


def test_the_reading_bounds_follow_the_itl_not_the_arrival_gap() -> None:
    b = _bounds(arrival_gap_mean_ms=1000.0, itl_p50_ms=23.0)
    assert (b.schedule_ms, b.loop_ms, b.recv_ms) == (100.0, 23.0, 23.0)
    # Chunks that already coalesce have an ITL p50 near 0: the floor holds.
    assert _bounds(arrival_gap_mean_ms=1000.0, itl_p50_ms=0.001).loop_ms == 10.0
    # No token gaps at all (nothing streamed): late reads distort nothing, the schedule bound holds.
    assert _bounds(arrival_gap_mean_ms=1000.0).loop_ms == 100.0


def test_an_explicit_bound_and_a_run_json_that_does_not_say_keep_the_old_rule() -> None:
    for b, source in (
        (_bounds(run_explicit=True, run_bound_ms=300.0, arrival_gap_mean_ms=200.0, itl_p50_ms=20.0), "explicit"),
        (_bounds(run_explicit=None, run_bound_ms=300.0, arrival_gap_mean_ms=200.0, itl_p50_ms=20.0), "run.json"),
    ):
        assert (b.schedule_ms, b.loop_ms, b.recv_ms, b.source) == (300.0, 300.0, 300.0, source)
    b = _bounds(explicit_ms=5.0, arrival_gap_mean_ms=200.0, itl_p50_ms=20.0)  # the caller's, over the rule
    assert (b.schedule_ms, b.loop_ms, b.recv_ms, b.source) == (5.0, 5.0, 20.0, "explicit")
    assert _bounds(run_explicit=None, run_bound_ms=None).schedule_ms == 10.0


class _Rec:
    def __init__(self, t_sched_us: int) -> None:
        self.t_sched_us = t_sched_us
        self.chunks = 0
        self.itl_us: list[int] = []


def test_the_summary_applies_the_rule_only_when_run_json_says_the_bound_was_not_given() -> None:
    at_5_per_s = [_Rec(i * 200_000) for i in range(50)]  # mean gap 200 ms
    lag = {"p99": 14.6}
    gen = {"loop_lag_ms": {"p99": 13.3}, "recv_delay_ms": {"p99": 2.0}}
    old = _generator({"max_schedule_lag_us": 10_000, "generator": gen}, lag, None, 25.0, at_5_per_s)
    assert old["saturated_by"] == ["schedule-lag p99 14.6 ms", "event-loop-lag p99 13.3 ms"]
    assert old["bound"]["source"] == "run.json"
    info = {"max_schedule_lag_us": 10_000, "max_schedule_lag_explicit": False, "generator": gen}
    new = _generator(info, lag, None, 25.0, at_5_per_s)
    assert not new["saturated"] and new["saturation_bound_ms"] == 20.0 and new["loop_lag_bound_ms"] == 25.0
    assert new["bound"] == {"source": "rule", "floor_ms": 10.0, "arrival_gap_mean_ms": 200.0, "arrival_gap_fraction": 0.1,
                            "ceiling_ms": 100.0, "itl_p50_ms": 25.0}  # fmt: skip
    faster_tokens = _generator(info, lag, None, 12.0, at_5_per_s)
    assert faster_tokens["saturated_by"] == ["event-loop-lag p99 13.3 ms (over ITL p50 12 ms)"]
    # Each signal with its own bound in words: the arrival rule's for the schedule lag, the ITL's
    # (or the floor) for the reading signals.
    low_rate = [_Rec(i * 2_000_000) for i in range(20)]  # 0.5/s: the schedule bound at its ceiling
    late = _generator(info, {"p99": 150.0}, None, 8.0, low_rate)
    assert late["saturation_bound_ms"] == 100.0 and late["loop_lag_bound_ms"] == 10.0
    assert gh.signals_text(late) == "schedule-lag p99 150.0 ms > 100.0 ms, event-loop-lag p99 13.3 ms > 10.0 ms"
    assert _generator({**info, "max_schedule_lag_explicit": True}, lag, None, 25.0, at_5_per_s)["saturated"]


# ---- the cause ---------------------------------------------------------------------------------


def _gen(own=0.04, worst=0.1, late=None, psi=None, avg10=None, switches=None, steal=None, coalesced=None) -> dict:
    out = {
        "max_cpu_share": own,
        "cpu": {"worst_interval_share": worst, "interval_s": 1.0, "while_late_share": late, "pressure_some_share": psi,
                "pressure_some_avg10_max": avg10, "involuntary_switches_per_s": switches, "steal_share": steal},
    }  # fmt: skip
    if coalesced is not None:
        out.update(gh.coalescing({"token_chunks": 1000, "coalesced": int(coalesced * 1000)}, None))
    return out


def test_a_busy_machine_is_named_with_its_figures_and_no_advice_to_add_workers() -> None:
    got = gh.decide_cause(_gen(own=0.04, late=0.02, psi=0.39, avg10=45.2, switches=0.5, steal=0.001), True)
    assert got["cause"] == "machine" and got["causes"] == ["machine"]
    assert got["cause_detail"] == (
        "the machine is busy: CPU pressure some 39% of the run (avg10 up to 45.2%), 0.5 involuntary switches/s, "
        "steal 0.1%, it ran 2.0% of the time its event loop was late; loadgen's own CPU was 4.0% of a core: "
        "free the machine or run the generator elsewhere"
    )
    assert "--workers" not in got["cause_detail"]
    # Each machine signal alone is enough: involuntary switches, steal, not running while late.
    assert gh.decide_cause(_gen(switches=150.0), True)["cause"] == "machine"
    assert gh.decide_cause(_gen(steal=0.08), True)["cause"] == "machine"
    assert gh.decide_cause(_gen(late=0.1), True)["cause"] == "machine"  # no PSI here: it was not running
    # avg10's highest value carries the run's own start-up: given, not held against the bound.
    assert gh.decide_cause(_gen(psi=0.04, avg10=15.0, switches=13.0), True)["cause"] == "undetermined"


def test_its_own_cpu_at_capacity_is_named_first_and_asks_for_workers() -> None:
    got = gh.decide_cause(_gen(own=0.92, worst=0.99), True)
    assert got["cause"] == "own_cpu"
    assert got["cause_detail"] == "its own CPU at 99% of a core in its busiest 1 s; add workers (--workers N) or lower the rate"
    # Its own code held the loop (the test burn, a long pause): full while late, modest over the run.
    got = gh.decide_cause(_gen(own=0.4, worst=0.45, late=0.95, psi=0.4), True)
    assert got["cause"] == "own_cpu" and got["causes"] == ["own_cpu"]
    assert got["cause_detail"].startswith("its own CPU at 95% of a core while its event loop was late (the machine was busy too: ")
    # The test burn on a busy machine (measured): others took a third of the burn's time, yet the
    # loop was late while the worker ran, not while it waited.
    got = gh.decide_cause(_gen(own=0.30, worst=0.38, late=0.69, psi=0.19, switches=78.9, steal=0.002), True)
    assert got["cause"] == "own_cpu"
    assert got["cause_detail"] == (
        "its own CPU at 69% of a core while its event loop was late (the machine was busy too: CPU pressure some "
        "19% of the run, 78.9 involuntary switches/s, steal 0.2%); add workers (--workers N) or lower the rate"
    )
    assert gh.decide_cause(_gen(own=0.86, worst=None), True)["cause_detail"].startswith("its own CPU at 86% of a core over the run")


def test_coalesced_reads_are_named_with_the_cause_or_alone() -> None:
    got = gh.decide_cause(_gen(psi=0.4, coalesced=0.19), True)
    assert got["causes"] == ["machine", "coalesced"]
    assert got["cause_detail"].endswith(
        "free the machine or run the generator elsewhere; 19% of token chunks shared a receive with the previous one "
        "(one kernel stamp for two tokens)"
    )
    got = gh.decide_cause(_gen(psi=0.01, switches=1.0, steal=0.0, coalesced=0.19), True)
    assert got["cause"] == "coalesced"
    assert gh.decide_cause(_gen(psi=0.4, coalesced=0.03), True)["causes"] == ["machine"]  # under its bound


def test_with_nothing_measured_busy_the_cause_is_undetermined_and_says_what_was_measured() -> None:
    got = gh.decide_cause(_gen(own=0.1, worst=0.2, psi=0.01, switches=1.0, steal=0.0), True)
    assert got["cause"] == "undetermined"
    assert got["cause_detail"] == (
        "its own CPU was 10% of a core and the machine was not measured busy (CPU pressure some 1.0% of the run, "
        "1 involuntary switches/s, steal 0.0%): add workers (--workers N) or lower the rate"
    )
    # A run.json from before any of this was measured: today's advice, nothing invented.
    assert gh.decide_cause({}, True)["cause_detail"] == "add workers (--workers N) or lower the rate"
    # Not saturated: no cause, the figures stay.
    got = gh.decide_cause(_gen(psi=0.4), False)
    assert got["cause"] is None and got["machine_busy"] is True and got["own_cpu_share"] == 0.04


def _summary(gen: dict) -> dict:
    return {
        "metrics": {"ttft": {"count": 10, "p99": 100.0}},
        "requests": {"measured": 10, "ok": 10, "errors": 0},
        "errors": {"total": 0, "by_category": {}},
        "generator": gen,
    }


@pytest.mark.parametrize(
    ("figures", "expected"),
    [
        (_gen(own=0.04, late=0.02, psi=0.39, avg10=45.2, switches=0.5, steal=0.001), "the machine is busy: "),
        (_gen(own=0.4, late=0.95), "its own CPU at 95% of a core while its event loop was late; add workers"),
    ],
)
def test_the_verdict_is_exit_4_with_the_signals_then_the_cause(figures, expected) -> None:
    gen = {**figures, "saturated": True, "saturated_by": ["schedule-lag p99 14.6 ms", "event-loop-lag p99 13.3 ms"],
           "schedule_lag_p99_ms": 14.6, "saturation_bound_ms": 10.0}  # fmt: skip
    gen.update(gh.decide_cause(gen, True))
    v = verdict_from_summary(_summary(gen), [])
    assert v.exit_code == EXIT_GENERATOR_SATURATED
    assert v.reason.startswith(
        "generator saturated: schedule-lag p99 14.6 ms > 10.0 ms, event-loop-lag p99 13.3 ms > 10.0 ms; "
    )
    assert expected in v.reason
    (note,) = gh.generator_notes(gen)
    assert note.startswith(
        "generator saturated: schedule-lag p99 14.6 ms over 10.0 ms, event-loop-lag p99 13.3 ms over 10.0 ms; "
    )
    assert expected in note


def test_under_the_rule_coalesced_reads_of_a_busy_generator_fail_the_run_and_are_noted_otherwise() -> None:
    # A replay on a machine taken by three busy processes (measured, docs/performance.md): every lag
    # under its bound, yet 21% of token chunks shared a recv; tokens ~1.2 ms apart, the loop 4.9 ms late.
    recs = [_Rec(i * 104_000) for i in range(89)]
    gen = {"max_cpu_share": 0.028, "loop_lag_ms": {"p99": 4.855}, "recv_delay_ms": {"p99": 1.155},
           "coalescing": {"token_chunks": 1568, "coalesced": 330, "share": 0.210459},
           "cpu": {"cpu_share": 0.028, "worst_interval_share": 0.04, "interval_s": 1.0, "while_late_share": 0.021,
                   "pressure_some_share": 0.56, "pressure_some_avg10_max": 45.39, "involuntary_switches_per_s": 6.89,
                   "steal_share": 0.0009}}  # fmt: skip
    info = {"max_schedule_lag_us": 10_000, "max_schedule_lag_explicit": False, "generator": gen}
    out = _generator(info, {"p99": 4.463}, None, 1.178, recs)
    assert out["saturated_by"] == ["coalesced reads 21% of token chunks (over 5.0%)"]
    assert out["causes"] == ["machine", "coalesced"]
    assert "shared a receive" not in out["cause_detail"]  # the signal already says it
    v = verdict_from_summary(_summary(out), [])
    assert v.exit_code == EXIT_GENERATOR_SATURATED
    assert v.reason.startswith(
        "generator saturated: coalesced reads 21% of token chunks (over 5.0%); the machine is busy: CPU pressure some 56%"
    )
    # An explicit bound (or a run.json that does not say): the old signals only, the chunks a note.
    for old in ({**info, "max_schedule_lag_explicit": True}, {k: v for k, v in info.items() if k != "max_schedule_lag_explicit"}):
        out = _generator(old, {"p99": 4.463}, None, 1.178, recs)
        assert not out["saturated"] and out["cause"] is None
        assert gh.generator_notes(out)[0].startswith("the ITL distribution is a lower bound: 21% of token chunks")
    # A quiet generator (the chunks came that way) or a loop never later than the token gap: a note.
    quiet = {**gen, "cpu": {**gen["cpu"], "pressure_some_share": 0.01, "while_late_share": None}}
    assert not _generator({**info, "generator": quiet}, {"p99": 4.4}, None, 1.178, recs)["saturated"]
    prompt = {**gen, "loop_lag_ms": {"p99": 1.0}}
    assert not _generator({**info, "generator": prompt}, {"p99": 4.4}, None, 1.178, recs)["saturated"]


def test_the_watch_counts_late_windows_and_how_much_of_them_the_worker_ran(monkeypatch) -> None:
    # A fake clock: each 20 ms tick of the loop's timer runs after a scripted wall time, with
    # scripted CPU used; the timer itself is not started (no hub runs it): the test calls it.
    clock = {"t": 0, "cpu": 0}
    script = [(20_500_000, 1_000_000),  # on time (0.5 ms late): not a late window
              (370_000_000, 350_000_000),  # its own code held the loop for 350 ms
              (60_000_000, 1_000_000),  # 40 ms late while it barely ran: others had the CPU
              (20_100_000, 0)]  # fmt: skip
    monkeypatch.setattr(health, "_perf_ns", lambda: clock["t"])
    monkeypatch.setattr(health, "_cpu_ns", lambda: clock["cpu"])
    monkeypatch.setattr(health, "read_counters", lambda: _counters(clock["t"] / 1e9, clock["cpu"] / 1e9))
    h = health.GeneratorHealth()
    h._arm()
    for wall, cpu in script:
        clock["t"] += wall
        clock["cpu"] += cpu
        h._on_tick()
    assert h.late_wakes == 2 and h.late_ns == 430_000_000 and h.late_cpu_ns == 351_000_000
    h.state(max_age_s=0.0)
    assert h.loop_lag.get_total_count() == 4
    assert h.loop_lag.get_max_value() == pytest.approx(350_000, rel=1e-3)  # µs, the 350 ms held
    w = worker_cpu(h.cpu_state())
    assert w["while_late_share"] == pytest.approx(351 / 430, abs=1e-4)
    # Over the whole watch (470.6 ms of fake time) it ran 352 ms.
    assert w["cpu_share"] == pytest.approx(352 / 470.6, abs=1e-3)
