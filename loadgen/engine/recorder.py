"""The recorder: HDR histograms per (metric, turn class, tenant, target) plus per-request records.

A worker records into a ``Recorder`` and periodically hands a *delta* (encoded histograms and the
records since the last delta) to whoever aggregates: the master in a distributed run, or the same
process in a local one. The aggregate side is ``MetricsAggregate``: it merges deltas exactly with
``decode_and_add`` (never averaging percentiles), keeps cumulative histograms for live views and
SLO checks, and interval histograms for ``metrics.hlog``.

Histogram values are µs, 1 µs .. 1 h, 3 significant digits (docs/metrics.md). Values outside the range
are clamped, because hdrh silently drops them. Which values a request contributes is
``analysis.records.metric_values``: one definition for the recorder and for any rebuild from
``requests.jsonl``.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from hdrh.histogram import HdrHistogram

from analysis.hlog import clamped_values, new_histogram, record_clamped, record_clamped_each
from analysis.records import (
    RECORD_FIELDS,
    RequestRecord,
    histogram_tag,
    parse_histogram_tag,
    request_values,
    series_values,
    tag_label,
)
from loadgen.engine.record_rows import RowPacker, unpack_rows

# A tag with at most this many values since the last report goes as the values themselves
# (8 bytes each), not as an encoded histogram: encoding one costs the worker ~0.6 ms (its 23,552
# counts, varint and zlib) and decoding it the master ~0.2 ms, where the values cost nothing to
# send and tens of µs to record. Most tags of most reports are small (TTFT: one value a request).
RAW_VALUES_MAX = 2048


@dataclass
class Delta:
    """What a worker ships per report: histogram deltas keyed by tag (encoded histograms, or for
    a small delta its values: little-endian int64 µs, already clamped), and new records: a worker's
    as packed rows (``record_rows``: ``packed_records``, ``packed_count``, read back into
    ``request_records`` by ``from_wire``), or as dicts (``records``)."""

    histograms: dict[str, str] = field(default_factory=dict)
    records: list[dict] = field(default_factory=list)
    values: dict[str, bytes] = field(default_factory=dict)
    packed_records: bytes = b""
    packed_count: int = 0
    request_records: list[RequestRecord] = field(default_factory=list)

    def to_wire(self) -> dict:
        wire = {"h": self.histograms, "r": self.records, "v": self.values}
        if self.packed_count:
            wire.update(rf=list(RECORD_FIELDS), rp=self.packed_records, rn=self.packed_count)
        return wire

    @classmethod
    def from_wire(cls, data: dict) -> Delta:
        """The delta of a report; ValueError, saying what, for a report whose parts are not what
        a worker sends or whose records cannot be read."""
        parts = {"h": dict, "r": list, "v": dict}
        for key, kind in parts.items():
            if not isinstance(data.get(key) or kind(), kind):
                raise ValueError(f"report: {key!r} must be a {kind.__name__}, not {type(data[key]).__name__}")
        return cls(
            histograms=dict(data.get("h") or {}),
            records=list(data.get("r") or []),
            values=dict(data.get("v") or {}),
            request_records=unpack_rows(data.get("rf"), data["rp"], data.get("rn")) if "rp" in data else [],
        )


def wire_record_count(data: dict) -> int:
    """How many records a report's wire form says it carries (without reading them)."""
    r, rn = data.get("r"), data.get("rn")
    return (len(r) if isinstance(r, list) else 0) + (rn if isinstance(rn, int) and rn > 0 else 0)


class Recorder:
    """Worker-side recorder. ``record_request`` is the only call on the request path.

    It appends: a request's values wait in plain lists per histogram tag and are recorded in bulk
    (``histogram_of``: every bucket once, with its count) when a list reaches ``FOLD_VALUES`` and
    at ``take``. Per-value ``record_value`` calls (~2-3 µs each, two per streamed chunk) were the
    worker's largest cost per chunk; folding in slices of a few thousand values keeps each pause
    of the event loop under a millisecond.
    """

    FOLD_VALUES = 4096

    def __init__(self, wire_records: bool = False) -> None:
        # A worker's records go on the wire as rows, each packed when its request is recorded, not
        # all at once when the report is built, where packing half a second's worth (~250 at 500
        # requests a second: 1.5-2 ms) kept every stream waiting and read a tick's chunks
        # together (loadgen.engine.record_rows).
        self._wire_records = wire_records
        self._rows = RowPacker() if wire_records else None
        self._delta: dict[str, HdrHistogram] = {}
        self._pending: dict[str, list[int]] = {}
        # (turn class, tenant, target) -> {metric: (tag, that tag's pending list)}: no tag per value.
        self._by_labels: dict[tuple[str, str, str], dict[str, tuple[str, list[int]]]] = {}
        self._records: list[RequestRecord] = []  # without wire_records
        # One histogram per tag, reset and refilled for every delta: a new one per tag and report
        # would be a reference cycle (hdrh's histogram and its encoder), freed only by the cyclic
        # GC, and the worker's RSS grew by its 180 KiB count arrays until a rare collection.
        self._wire: dict[str, HdrHistogram] = {}

    def record(self, metric: str, value_us: int, turn_class: str, tenant: str, target: str) -> None:
        tag, values = self._slot(metric, (turn_class, tenant, target))
        values.append(value_us)
        if len(values) >= self.FOLD_VALUES:
            self._fold(tag, values)

    def _slot(self, metric: str, labels: tuple[str, str, str]) -> tuple[str, list[int]]:
        per_metric = self._by_labels.get(labels)
        if per_metric is None:
            per_metric = self._by_labels[labels] = {}
        slot = per_metric.get(metric)
        if slot is None:
            tag = histogram_tag(metric, *labels)
            slot = per_metric[metric] = (tag, self._pending.setdefault(tag, []))
        return slot

    def _fold(self, tag: str, values: list[int]) -> None:
        h = self._delta.get(tag)
        if h is None:
            h = self._delta[tag] = self._wire_histogram(tag) if self._wire_records else new_histogram()
        record_clamped(h, values)
        values.clear()

    def _wire_histogram(self, tag: str) -> HdrHistogram:
        """The tag's reused histogram for ``take_delta``, emptied."""
        h = self._wire.get(tag)
        if h is None:
            h = self._wire[tag] = new_histogram()
        else:
            clear(h)
        return h

    def record_request(self, rec: RequestRecord) -> None:
        """``metric_values(rec)`` into the pending values: the one-value metrics one by one, a
        request's gaps and chunk sizes each at once."""
        labels = (rec.turn_class, rec.tenant, rec.target)
        slot = self._slot
        for metric, value in request_values(rec):
            tag, values = slot(metric, labels)
            values.append(value)
            if len(values) >= self.FOLD_VALUES:
                self._fold(tag, values)
        for metric, series in series_values(rec):
            tag, values = slot(metric, labels)
            values.extend(series)
            if len(values) >= self.FOLD_VALUES:
                self._fold(tag, values)
        if self._rows is not None:
            self._rows.add(rec)
        else:
            self._records.append(rec)

    def take_delta(self) -> Delta:
        """Encode and clear everything recorded since the last call (for the wire): the values
        already folded into a histogram (a tag that passed ``FOLD_VALUES`` since the last call)
        and those still pending."""
        pending, self._pending, self._by_labels = self._pending, {}, {}
        folded, self._delta = self._delta, {}
        encoded, raw = {}, {}
        for tag in folded.keys() | {tag for tag, values in pending.items() if values}:
            h = folded.get(tag)
            values = pending.get(tag)
            if h is None and values and len(values) <= RAW_VALUES_MAX:
                raw[tag] = clamped_values(values).astype("<i8", copy=False).tobytes()
                continue
            if h is None:
                h = self._wire_histogram(tag)
            if values:
                record_clamped(h, values)
            encoded[tag] = h.encode()
        if self._rows is not None:
            packed, count = self._rows.take()
            return Delta(histograms=encoded, values=raw, packed_records=packed, packed_count=count)
        records, self._records = self._records, []
        return Delta(histograms=encoded, records=[r.to_dict() for r in records], values=raw)

    def take(self) -> tuple[dict[str, HdrHistogram], list[RequestRecord]]:
        """Hand over and clear everything recorded since the last call (same process, no encoding;
        a recorder made without ``wire_records``)."""
        if self._wire_records:
            raise RuntimeError("take() is for a recorder whose records stay objects")
        for tag, values in self._pending.items():
            if values:
                self._fold(tag, values)
        hists = {tag: h for tag, h in self._delta.items() if h.get_total_count()}
        self._delta, self._pending, self._by_labels = {}, {}, {}
        records, self._records = self._records, []
        return hists, records

    def reset(self) -> None:
        self._delta, self._pending, self._by_labels = {}, {}, {}
        self._records = []
        if self._rows is not None:
            self._rows.take()


def histogram_of(values: list[int] | np.ndarray) -> HdrHistogram:
    """A new histogram holding ``values`` (µs; clamped to the range, as ``clamp_us`` does).

    The same counts, total, min and max as recording each value, for a fraction of the cost
    (``analysis.hlog.record_clamped``).
    """
    return record_clamped(new_histogram(), values)


def clear(h: HdrHistogram) -> None:
    """What hdrh's ``reset()`` does, without its Python loop over every bucket (23,552 at
    1 µs..1 h: 1.6 ms, where zeroing the counts array at once takes 0.02 ms)."""
    ctypes.memset(h.counts, 0, ctypes.sizeof(h.counts))
    h.total_count = 0
    h.min_value = sys.maxsize
    h.max_value = 0
    h.start_time_stamp_msec = sys.maxsize
    h.end_time_stamp_msec = 0


def metric_sums(rec: RequestRecord) -> list[tuple[str, int]]:
    """Per metric, the sum of the values ``metric_values(rec)`` yields (the same recording rule).

    Summed here rather than by iterating ``metric_values``: a request's ITL gaps are hundreds of
    values, and ``sum`` over the list costs ~1 µs where the generator costs ~100 µs. The metrics
    with one value per request come from ``records.request_values``, as in ``metric_values``.
    """
    out = request_values(rec)
    if not rec.ok:
        return out
    if rec.itl_us:
        out.append(("itl", sum(rec.itl_us)))
    if rec.chunks:
        out.append(("tokens_per_chunk", rec.chunks if rec.chunk_tokens is None else sum(rec.chunk_tokens)))
    return out


@dataclass
class LabelTotals:
    """Counters of one (turn class, tenant, target), for exporters that break totals down by label."""

    ok: int = 0
    failed: int = 0
    errors: dict[str, int] = field(default_factory=dict)  # failed requests by category
    output_tokens: int = 0
    input_tokens: int = 0
    # Exact sum of each metric's values (µs): a histogram knows counts per range, not sums.
    sums_us: dict[str, int] = field(default_factory=dict)


class MetricsAggregate:
    """Master-side (or local) merge of deltas: cumulative and current-interval histograms."""

    def __init__(self, request_meets_slos: Callable[[RequestRecord], bool] | None = None) -> None:
        self.cumulative: dict[str, HdrHistogram] = {}
        self.interval: dict[str, HdrHistogram] = {}
        self.requests = 0
        self.errors: dict[str, int] = {}
        self.output_tokens = 0
        self.prompt_tokens = 0
        self._meets = request_meets_slos
        self.slo_met = 0
        self.slo_total = 0
        # The last interval taken (its histograms, emptied, hold the interval after the next: a
        # new histogram costs ~130 µs of hdrh's set-up of 23,552 counts, emptying one ~7), and its
        # merges over labels, made when a live view asks.
        self._last_interval: dict[str, HdrHistogram] = {}
        self._last_by_metric: dict[str, HdrHistogram] | None = None
        self._last_by_class: dict[tuple[str, str], HdrHistogram] | None = None
        # Keyed by labels as they appear in histogram tags, so totals join their histograms.
        self.by_labels: dict[tuple[str, str, str], LabelTotals] = {}
        self._tag_labels: dict[tuple[str, str, str], tuple[str, str, str]] = {}

    def merge(self, delta: Delta) -> list[RequestRecord]:
        """Merge a worker's delta: each encoded histogram decoded once and added, each small
        delta's values recorded (exact either way: counts add). Packed records are read first: a
        delta whose records cannot be read (ValueError) leaves nothing merged."""
        packed = unpack_rows(RECORD_FIELDS, delta.packed_records, delta.packed_count) if delta.packed_count else []
        for tag, payload in delta.histograms.items():
            src = HdrHistogram.decode(payload)
            for table in (self.cumulative, self.interval):
                h = table.get(tag)
                if h is None:
                    h = table[tag] = new_histogram()
                h.add(src)
        for tag, raw in delta.values.items():
            hs = []
            for table in (self.cumulative, self.interval):
                h = table.get(tag)
                if h is None:
                    h = table[tag] = new_histogram()
                hs.append(h)
            # Both histograms at once: the values' buckets found once (a third of a light run's
            # master CPU was finding them twice).
            record_clamped_each(hs, np.frombuffer(raw, dtype="<i8"))
        return self._count([*map(RequestRecord.from_dict, delta.records), *delta.request_records, *packed])

    def merge_local(
        self, hists: dict[str, HdrHistogram], records: list[RequestRecord]
    ) -> list[RequestRecord]:
        """Merge a same-process recorder's histograms (add: exact, and no encode/decode)."""
        for tag, src in hists.items():
            for table in (self.cumulative, self.interval):
                h = table.get(tag)
                if h is None:
                    h = table[tag] = new_histogram()
                h.add(src)
        return self._count(records)

    def _count(self, records: list[RequestRecord]) -> list[RequestRecord]:
        for r in records:
            self.requests += 1
            if not r.ok and r.error_category:
                self.errors[r.error_category] = self.errors.get(r.error_category, 0) + 1
            self.output_tokens += r.output_tokens
            self.prompt_tokens += r.prompt_tokens or 0
            if self._meets is not None:
                self.slo_total += 1
                self.slo_met += bool(r.ok and self._meets(r))
            self._count_by_labels(r)
        return records

    def _count_by_labels(self, r: RequestRecord) -> None:
        raw = (r.turn_class, r.tenant, r.target)
        key = self._tag_labels.get(raw)
        if key is None:
            key = self._tag_labels[raw] = (tag_label(r.turn_class), tag_label(r.tenant), tag_label(r.target))
        totals = self.by_labels.get(key)
        if totals is None:
            totals = self.by_labels[key] = LabelTotals()
        if r.ok:
            totals.ok += 1
        else:
            totals.failed += 1
            if r.error_category:
                totals.errors[r.error_category] = totals.errors.get(r.error_category, 0) + 1
        totals.output_tokens += r.output_tokens
        totals.input_tokens += r.prompt_tokens or 0
        sums = totals.sums_us
        for metric, value in metric_sums(r):
            sums[metric] = sums.get(metric, 0) + value

    def take_interval(self) -> dict[str, HdrHistogram]:
        """The interval histograms since the last call (per tag), and start a new interval.

        What it returns stays as it is until the next call, which empties those histograms and
        fills them with the interval after (use them, or copy them, before then)."""
        out = {tag: h for tag, h in self.interval.items() if h.get_total_count()}
        # Only the tags that had values are kept for reuse: a tag seen once (a tenant, a turn
        # class of one phase) does not hold two count arrays (~190 KiB each) for the rest of the run.
        spare, self._last_interval = self._last_interval, out
        for h in spare.values():
            clear(h)
        self.interval = spare
        self._last_by_metric = self._last_by_class = None
        return out

    def _merge_last_interval(self) -> None:
        by_metric: dict[str, HdrHistogram] = {}
        by_class: dict[tuple[str, str], HdrHistogram] = {}
        for tag, h in self._last_interval.items():
            metric, turn_class, _tenant, _target = parse_histogram_tag(tag)
            for table, key in ((by_metric, metric), (by_class, (metric, turn_class))):
                if key not in table:
                    table[key] = new_histogram()
                table[key].add(h)
        self._last_by_metric, self._last_by_class = by_metric, by_class

    def last_interval_by_metric(self) -> dict[str, HdrHistogram]:
        """The last taken interval merged over labels, per metric (for live charts)."""
        if self._last_by_metric is None:
            self._merge_last_interval()
        assert self._last_by_metric is not None
        return self._last_by_metric

    def last_interval_by_turn_class(self) -> dict[tuple[str, str], HdrHistogram]:
        """The last taken interval merged over tenants and targets, per (metric, turn class)."""
        if self._last_by_class is None:
            self._merge_last_interval()
        assert self._last_by_class is not None
        return self._last_by_class

    def combined(self, metric: str, turn_class: str | None = None) -> HdrHistogram:
        """One histogram for ``metric`` over all labels (optionally one turn class), merged exactly."""
        out = new_histogram()
        for tag, h in self.cumulative.items():
            m, tc, _tenant, _target = parse_histogram_tag(tag)
            if m == metric and (turn_class is None or tc == turn_class):
                out.add(h)
        return out

    def reset_live(self) -> None:
        """The web UI's reset button: forget live numbers (the results files keep everything)."""
        self.cumulative.clear()
        self.requests = 0
        self.errors = {}
        self.output_tokens = self.prompt_tokens = 0
        self.slo_met = self.slo_total = 0
        self.by_labels = {}
