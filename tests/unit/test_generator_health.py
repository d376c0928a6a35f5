"""The generator's own saturation signals: exact merge over workers, and the summary's decision."""

from __future__ import annotations

from analysis.summary import _generator
from loadgen.engine.health import GeneratorHealth, summarize
from loadgen.engine.recorder import histogram_of


def _state(loop_lag_us: list[int], recv_delay_ns: list[int]) -> dict:
    h = GeneratorHealth()
    h.loop_lag = histogram_of(loop_lag_us)
    h.recv_delays_ns.extend(recv_delay_ns)
    return {"health": h.state()}


def test_workers_histograms_merge_exactly_and_the_client_keeps_its_list() -> None:
    h = GeneratorHealth()
    sink = h.recv_delays_ns
    sink.extend([2_000_000, 4_000_000])
    h.state()
    assert h.recv_delays_ns is sink and sink == []  # streams hold this very list
    out = summarize({"a": _state([100] * 98 + [50_000, 60_000], [1_000_000] * 10), "b": _state([200] * 100, [])})
    assert out["loop_lag_ms"]["count"] == 200
    assert 60.0 <= out["loop_lag_ms"]["max"] < 60.04  # hdrh's max: its bucket's top, 32 µs wide at 60 ms
    assert out["recv_delay_ms"] == {"count": 10, "p50": 1.0, "p99": 1.0, "max": 1.0}
    assert summarize({"c": {}}) == {"loop_lag_ms": None, "recv_delay_ms": None}


def test_each_signal_over_its_bound_flags_saturation_and_is_named() -> None:
    lag_ok = {"p99": 2.0}
    quiet = {"generator": {"loop_lag_ms": {"p99": 3.0}, "recv_delay_ms": {"p99": 4.0}}}
    assert _generator(quiet, lag_ok, 10.0, 20.0)["saturated_by"] == []
    busy_loop = {"generator": {"loop_lag_ms": {"p99": 30.0}, "recv_delay_ms": None}}
    gen = _generator(busy_loop, lag_ok, 10.0, 20.0)
    assert gen["saturated"] and gen["saturated_by"] == ["event-loop-lag p99 30.0 ms"]
    # A chunk read late keeps its kernel stamp: a receive delay under the streams' typical gap
    # costs no accuracy, one over it does.
    late_reads = {"generator": {"recv_delay_ms": {"p99": 16.0}}}
    assert not _generator(late_reads, lag_ok, 10.0, 23.0)["saturated"]
    gen = _generator(late_reads, lag_ok, 10.0, 12.0)
    assert gen["saturated_by"] == ["receive-delay p99 16.0 ms (over ITL p50 12 ms)"]
    assert _generator(late_reads, lag_ok, 10.0, 0.001)["saturated_by"] == ["receive-delay p99 16.0 ms"]
    assert _generator({}, {"p99": 11.0}, 10.0)["saturated_by"] == ["schedule-lag p99 11.0 ms"]


def test_the_loop_lag_timer_ticks_in_the_hub_until_stopped_and_a_failing_tick_keeps_it_armed(monkeypatch) -> None:
    import gevent

    from loadgen.engine import health as health_mod

    h = GeneratorHealth(period_s=0.005)
    calls = {"n": 0}
    real_if_late = health_mod.COLLECTOR.if_late

    def if_late() -> None:  # the second tick's work fails: the timer must still run again
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("a tick's work failed")
        real_if_late()

    monkeypatch.setattr(health_mod.COLLECTOR, "if_late", if_late)
    h.start()
    try:
        gevent.sleep(0.2)
    finally:
        h.stop()
    ticks = calls["n"]
    assert ticks >= 5  # 40 were due; a busy 2-core machine runs fewer, never none after a failure
    gevent.sleep(0.05)
    assert calls["n"] == ticks  # stopped: no tick after stop()
    state = h.state(max_age_s=0.0)
    assert state["loop_lag"] and h.loop_lag.get_total_count() == ticks


def test_the_probe_slows_to_its_idle_period_while_no_request_is_in_flight(monkeypatch) -> None:
    from loadgen.engine import health as health_mod

    clock = {"t": 10**12}
    monkeypatch.setattr(health_mod, "_perf_ns", lambda: clock["t"])
    h = GeneratorHealth(period_s=0.02, idle_period_s=0.25)
    in_flight = {"n": 0}
    h.busy = lambda: in_flight["n"] > 0
    h._next_sample_ns = 2**62  # no counters sampled (nor lags folded) in this test
    h._arm()
    assert h._armed_period_ns == 250_000_000
    in_flight["n"] = 1
    clock["t"] += 253_000_000  # the idle tick, 3 ms late: its lag is taken against 250 ms
    h._on_tick()
    assert h._lags_us[-1] == 3_000
    assert h._armed_period_ns == 20_000_000  # re-armed at the busy pace
    in_flight["n"] = 0
    clock["t"] += 20_500_000
    h._on_tick()
    assert h._lags_us[-1] == 500
    assert h._armed_period_ns == 250_000_000
