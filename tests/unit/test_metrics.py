"""Recorder -> delta -> aggregate: the merge is exact, and equals a rebuild from the records."""

from __future__ import annotations

import random

import pytest

from analysis.hlog import clamp_us, new_histogram
from analysis.records import RequestRecord, histogram_tag, metric_values
from loadgen.engine import recorder as recorder_module
from loadgen.engine.recorder import RAW_VALUES_MAX, Delta, MetricsAggregate, Recorder


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


@pytest.mark.parametrize(
    ("wire_records", "fold_values", "raw_values_max"),
    [
        (False, Recorder.FOLD_VALUES, RAW_VALUES_MAX),
        (True, Recorder.FOLD_VALUES, RAW_VALUES_MAX),
        (True, Recorder.FOLD_VALUES, 0),  # every delta an encoded histogram
        (True, Recorder.FOLD_VALUES, 40),  # some tags as values, some encoded, in one delta
        (False, 7, RAW_VALUES_MAX),
        (True, 7, RAW_VALUES_MAX),
    ],
)
def test_merge_of_deltas_from_several_workers_equals_rebuild_from_records(
    wire_records: bool, fold_values: int, raw_values_max: int, monkeypatch
) -> None:
    """With folds between reports too (a tag past FOLD_VALUES between two reports: ~8,000 ITL
    values a second at 0.5 s reports): those values once never reached the wire. Small deltas
    travel as their values, bigger ones as encoded histograms: the merge is the same."""
    monkeypatch.setattr(recorder_module, "RAW_VALUES_MAX", raw_values_max)
    rng = random.Random(3)
    workers = [Recorder(wire_records=wire_records) for _ in range(3)]
    for w in workers:
        w.FOLD_VALUES = fold_values
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


@pytest.mark.parametrize("wire_records", [False, True])
def test_take_delta_clears_and_records_travel_whole(wire_records: bool) -> None:
    r = Recorder(wire_records=wire_records)  # a worker's packs each record as it records it
    rec = _record(1, random.Random(1))
    r.record_request(rec)
    d = r.take_delta()
    if wire_records:
        assert d.records == [] and d.packed_count == 1 and d.packed_records
        assert Delta.from_wire(d.to_wire()).request_records == [rec]
    else:
        assert d.records == [rec.to_dict()]
    assert d.values and not d.histograms  # a request's few values go as themselves
    empty = r.take_delta()
    assert empty.records == [] and empty.histograms == {} and empty.values == {} and not empty.packed_count


def test_a_recorder_of_wire_records_refuses_take() -> None:
    r = Recorder(wire_records=True)
    r.record_request(_record(1, random.Random(1)))
    with pytest.raises(RuntimeError):
        r.take()


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
    counts = {tag: h.get_total_count() for tag, h in first.items()}
    assert agg.last_interval_by_metric()["ttft"].get_total_count() == 1
    assert agg.last_interval_by_turn_class()[("ttft", "first")].get_total_count() == 1
    assert agg.take_interval() == {}
    assert agg.last_interval_by_metric() == {}
    # The next intervals reuse the histograms, emptied: each holds its own interval only.
    for _ in range(2):
        r.record_request(_record(0, random.Random(2)))
        agg.merge(r.take_delta())
        again = agg.take_interval()
        assert {tag: h.get_total_count() for tag, h in again.items()} == counts
    assert agg.combined("ttft").get_total_count() == 3  # the cumulative ones are never emptied
    # A tag without values for an interval is not kept for reuse (nor its ~190 KiB of counts).
    agg.take_interval()
    agg.take_interval()
    assert agg.interval == {} and agg._last_interval == {}


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


def test_bulk_recording_gives_the_same_histogram_as_recording_each_value() -> None:
    from analysis.hlog import clamp_us, new_histogram
    from loadgen.engine.recorder import histogram_of

    rng = random.Random(11)
    values = [
        rng.choice([rng.randint(1, 50), rng.randint(9_000, 11_000), rng.randint(0, 10**10)])
        for _ in range(5000)
    ]
    values += [0, -5, 10**13, 2.5, 3.5, 1_000_000.49, 2047, 2048, 2049, 4095, 4096, 4097]
    # Whole lists, a single value, and values sharing one bucket (its max must stay exact).
    for case in (values, [7], [10_000, 10_001, 10_003, 10_002], [3_600_000_000] * 3):
        one_by_one = new_histogram()
        for v in case:
            one_by_one.record_value(clamp_us(v))
        bulk = histogram_of(case)
        assert list(bulk.counts) == list(one_by_one.counts)
        assert (bulk.get_total_count(), bulk.get_min_value(), bulk.get_max_value()) == (
            one_by_one.get_total_count(),
            one_by_one.get_min_value(),
            one_by_one.get_max_value(),
        )


def test_bulk_recording_adds_to_a_histogram_that_already_holds_values() -> None:
    from hdrh.histogram import HdrHistogram

    from analysis.hlog import new_histogram, record_clamped

    rng = random.Random(13)
    first = [rng.randint(500, 10**6) for _ in range(300)]
    second = [rng.randint(1, 10**9) for _ in range(300)] + [3, 10**9 + 7]
    one_by_one, bulk = new_histogram(), new_histogram()
    for v in first + second:
        one_by_one.record_value(v)
    record_clamped(record_clamped(bulk, first), second)
    assert list(bulk.counts) == list(one_by_one.counts)
    assert (bulk.get_total_count(), bulk.get_min_value(), bulk.get_max_value()) == (
        one_by_one.get_total_count(),
        one_by_one.get_min_value(),
        one_by_one.get_max_value(),
    )
    # A histogram of another range: values it cannot hold are left out, as hdrh's record_value does.
    narrow, expected = HdrHistogram(1, 1000, 2), HdrHistogram(1, 1000, 2)
    for v in (5, 900, 10**6):
        expected.record_value(v)
    record_clamped(narrow, [5, 900, 10**6])
    assert list(narrow.counts) == list(expected.counts)
    assert narrow.get_total_count() == expected.get_total_count() == 2


def test_folding_in_slices_gives_the_same_histograms_as_one_fold() -> None:
    rng = random.Random(12)
    recs = [_record(i, rng) for i in range(50)]
    whole, sliced = Recorder(), Recorder()
    sliced.FOLD_VALUES = 7  # fold every few values, mid-request included
    for rec in recs:
        whole.record_request(rec)
        sliced.record_request(rec)
    a, _ = whole.take()
    b, _ = sliced.take()
    assert set(a) == set(b)
    for tag in a:
        assert list(a[tag].counts) == list(b[tag].counts), tag
        assert (a[tag].get_min_value(), a[tag].get_max_value()) == (
            b[tag].get_min_value(),
            b[tag].get_max_value(),
        )


def test_each_delta_encodes_only_its_own_values_though_the_histograms_are_reused() -> None:
    from loadgen.engine.recorder import histogram_of

    r, rng = Recorder(), random.Random(7)
    for batch in range(3):  # a tag seen in every delta reuses one histogram, cleared in between
        values = [rng.randint(1, 10**8) for _ in range(RAW_VALUES_MAX + 1 + batch)]
        for v in values:
            r.record("ttft", v, "first", "t", "x")
        encoded = r.take_delta().histograms[histogram_tag("ttft", "first", "t", "x")]
        assert encoded == histogram_of(values).encode()
        h = new_histogram()
        h.decode_and_add(encoded)
        assert (h.get_total_count(), h.get_max_value()) == (len(values), histogram_of(values).get_max_value())
