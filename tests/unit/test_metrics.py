"""Recorder -> delta -> aggregate: the merge is exact, and equals a rebuild from the records."""

from __future__ import annotations

import random

from analysis.hlog import clamp_us, new_histogram
from analysis.records import RequestRecord, histogram_tag, metric_values
from loadgen.metrics import Delta, MetricsAggregate, Recorder


def _record(i: int, rng: random.Random, ok: bool = True) -> RequestRecord:
    t_sched = i * 1000
    t_send = t_sched + rng.randint(0, 500)
    t_first = t_send + rng.randint(1000, 400_000)
    gaps = [rng.randint(5_000, 60_000) for _ in range(rng.randint(1, 30))]
    t_last = t_first + sum(gaps)
    return RequestRecord(
        request_id=f"r{i}",
        session_id=f"s{i // 3}",
        session_index=i // 3,
        turn_index=i % 3,
        turn_class="first" if i % 3 == 0 else "follow-up",
        tenant="a" if i % 2 else "b",
        target="sim",
        worker="w",
        status="ok" if ok else "error",
        t_sched_us=t_sched,
        t_send_us=t_send,
        t_first_us=t_first if ok else None,
        t_last_us=t_last if ok else None,
        t_end_us=t_last + 300 if ok else t_send + 50,
        output_tokens=len(gaps) + 1 if ok else 0,
        chunks=len(gaps) + 1 if ok else 0,
        itl_us=gaps if ok else [],
        error_category=None if ok else "http_5xx",
    )


def test_merge_of_deltas_from_several_workers_equals_rebuild_from_records() -> None:
    rng = random.Random(3)
    workers = [Recorder() for _ in range(3)]
    agg = MetricsAggregate()
    all_records = []
    for i in range(600):
        rec = _record(i, rng, ok=(i % 17 != 0))
        all_records.append(rec)
        workers[i % 3].record_request(rec)
        if i % 50 == 49:  # periodic reports, interleaved across workers
            for w in workers:
                agg.merge(Delta.from_wire(w.take_delta().to_wire()))
    for w in workers:
        agg.merge(w.take_delta())

    rebuilt: dict[str, object] = {}
    for rec in all_records:
        for metric, value in metric_values(rec):
            tag = histogram_tag(metric, rec.turn_class, rec.tenant, rec.target)
            h = rebuilt.setdefault(tag, new_histogram())
            h.record_value(clamp_us(value))
    assert set(rebuilt) == set(agg.cumulative)
    for tag, h in rebuilt.items():
        got = agg.cumulative[tag]
        assert got.get_total_count() == h.get_total_count(), tag
        assert list(got.counts) == list(h.counts), tag  # bucket-identical
    assert agg.requests == 600
    assert agg.errors == {"http_5xx": sum(1 for i in range(600) if i % 17 == 0)}


def test_take_delta_clears_and_records_travel_as_dicts() -> None:
    r = Recorder()
    rec = _record(1, random.Random(1))
    r.record_request(rec)
    d = r.take_delta()
    assert d.records == [rec.to_dict()]
    assert d.histograms
    empty = r.take_delta()
    assert empty.records == [] and empty.histograms == {}


def test_values_outside_the_histogram_range_are_clamped_not_dropped() -> None:
    r = Recorder()
    r.record("ttft", 0, "first", "t", "x")
    r.record("ttft", 10**13, "first", "t", "x")
    agg = MetricsAggregate()
    agg.merge(r.take_delta())
    h = agg.combined("ttft")
    assert h.get_total_count() == 2


def test_interval_histograms_restart_and_last_interval_is_merged_by_metric() -> None:
    r = Recorder()
    agg = MetricsAggregate()
    r.record_request(_record(0, random.Random(2)))
    agg.merge(r.take_delta())
    first = agg.take_interval()
    assert first and all(h.get_total_count() for h in first.values())
    assert agg.take_interval() == {}
    assert "ttft" in agg.last_interval_by_metric() or agg.last_interval_by_metric() == {}


def test_live_slo_attainment_counts_errors_as_misses() -> None:
    agg = MetricsAggregate(request_meets_slos=lambda rec: (rec.ttft_us or 0) < 200_000)
    r = Recorder()
    rng = random.Random(5)
    recs = [_record(i, rng, ok=(i % 4 != 0)) for i in range(40)]
    for rec in recs:
        r.record_request(rec)
    agg.merge(r.take_delta())
    expected = sum(1 for rec in recs if rec.ok and rec.ttft_us < 200_000)
    assert agg.slo_total == 40
    assert agg.slo_met == expected
