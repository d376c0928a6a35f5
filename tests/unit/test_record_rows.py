"""A worker's records on the wire as packed rows: the same records come out, a report is about
half the size of the dicts and packs as one ``bytes``, and a report that cannot be read says why."""

from __future__ import annotations

import dataclasses
import random

import msgpack
import pytest

from analysis.records import RECORD_FIELDS, RequestRecord
from loadgen.engine.record_rows import RowPacker, unpack_rows
from loadgen.engine.recorder import Delta, MetricsAggregate, Recorder, wire_record_count
from loadgen.runtime.verdict import incomplete_reasons

from .test_metrics import _record as _metrics_record


def _record(i: int, rng: random.Random) -> RequestRecord:
    """test_metrics' record with every kind of field a row carries: text beyond ASCII, None,
    lists, a nested map, booleans."""
    ok = i % 5 != 0
    rec = _metrics_record(i, rng, ok=ok)
    return dataclasses.replace(
        rec,
        request_id=f"r{i}-é",
        chunk_tokens=[2] * rec.chunks if i % 7 == 0 else None,
        error_message=None if ok else "HTTP 503: Service Unavailable ✗",
        http_status=200 if ok else 503,
        server_timings={"queue_ms": 1.5, "prefill_ms": 20, "nested": {"a": [1, 2]}} if i % 4 == 0 else None,
        parent_ids=["p0", "p1"] if i % 6 == 0 else None,
        sent=i % 11 != 0,
        reasoning_tokens=None if i % 5 == 0 else 12,
    )


def _report(records: list[RequestRecord]) -> dict:
    """A worker's report of ``records``, in its wire form."""
    worker = Recorder(wire_records=True)
    for rec in records:
        worker.record_request(rec)
    return worker.take_delta().to_wire()


def test_records_come_back_equal_through_a_report() -> None:
    rng = random.Random(7)
    records = [_record(i, rng) for i in range(300)]
    wire = _report(records)
    # Through the same msgpack settings as Locust's messages, as a master receives them.
    wire = msgpack.unpackb(msgpack.packb(wire), raw=False, strict_map_key=False)
    assert wire_record_count(wire) == 300
    delta = Delta.from_wire(wire)
    assert delta.request_records == records
    agg = MetricsAggregate()
    assert agg.merge(delta) == records
    assert agg.requests == 300


def test_a_report_packs_its_records_once_at_half_the_size_of_the_dicts() -> None:
    """Regression: the records went as a list of dicts that Locust's packb walked in one go, in
    the greenlet that holds the event loop while the report is built (~2 ms at 500 requests a
    second, every 0.5 s). Now they are one bytes object packed as they were recorded."""
    rng = random.Random(1)
    records = [_record(i, rng) for i in range(250)]
    wire = _report(records)
    assert wire["r"] == [] and isinstance(wire["rp"], bytes) and wire["rn"] == 250
    as_dicts = len(msgpack.packb([r.to_dict() for r in records]))
    assert len(wire["rp"]) < 0.6 * as_dicts


def test_rows_of_another_version_keep_the_fields_this_one_knows() -> None:
    rec = _record(3, random.Random(3))
    names = [*RECORD_FIELDS[:-1], "a_field_of_a_later_version"]  # one field less, one unknown
    row = [getattr(rec, n) for n in RECORD_FIELDS[:-1]] + ["x"]
    [got] = unpack_rows(names, msgpack.packb(row), 1)
    last = RECORD_FIELDS[-1]
    default = next(f.default for f in dataclasses.fields(RequestRecord) if f.name == last)
    assert got.to_dict() == {**rec.to_dict(), last: default}


def _rows(n: int) -> bytes:
    packer = RowPacker()
    for i in range(n):
        packer.add(_record(i, random.Random(i)))
    return packer.take()[0]


@pytest.mark.parametrize(
    ("names", "packed", "count", "says"),
    [
        (list(RECORD_FIELDS), "not bytes", 1, "must be bytes"),
        ("fields", _rows(1), 1, "field names"),
        (list(RECORD_FIELDS), _rows(2), 3, "2 rows read where the report says 3"),
        (list(RECORD_FIELDS), _rows(2)[:-5], 2, "1 rows read where the report says 2"),  # cut short
        (list(RECORD_FIELDS), _rows(1), -1, "whole number"),
        (list(RECORD_FIELDS), msgpack.packb([1, 2, 3]), 1, "not a list of"),
        (list(RECORD_FIELDS), msgpack.packb({"request_id": "r"}), 1, "not a list of"),
        (list(RECORD_FIELDS), b"\xc1\xc1\xc1", 1, "cannot be read"),  # 0xc1: never used by msgpack
        (["request_id", "bogus_only"], msgpack.packb(["r", 1]), 1, "cannot be read"),  # required fields missing
    ],
)
def test_a_report_that_cannot_be_read_says_why(names: object, packed: object, count: object, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        unpack_rows(names, packed, count)


def test_unreadable_records_make_the_run_incomplete() -> None:
    info = {"unreadable_reports": [{"worker": "host_1", "reports": 2, "records": 500, "why": "records: ..."}]}
    summary = {"requests": {"measured": 10, "ok": 10}, "errors": {}}
    assert incomplete_reasons(summary, info) == [
        "500 records in reports the master could not read (from host_1)"
    ]


@pytest.mark.parametrize(
    ("part", "value"), [("r", "not a list"), ("h", ["not", "a", "map"]), ("v", 7)]
)
def test_a_report_of_the_wrong_shape_is_refused_in_one_line(part: str, value: object) -> None:
    wire = {**_report([_record(1, random.Random(1))]), part: value}
    with pytest.raises(ValueError, match=f"report: '{part}' must be a"):
        Delta.from_wire(wire)
    assert wire_record_count(wire) == 1  # the packed row, whatever the rest holds


def test_a_worker_delta_merged_in_process_whose_rows_cannot_be_read_merges_nothing() -> None:
    worker = Recorder(wire_records=True)
    worker.record_request(_record(1, random.Random(1)))
    delta = worker.take_delta()
    delta.packed_records = delta.packed_records[:-2]
    agg = MetricsAggregate()
    with pytest.raises(ValueError):
        agg.merge(delta)
    assert agg.cumulative == {} and agg.requests == 0
