"""The recorder: HDR histograms per (metric, turn class, tenant, target) plus per-request records.

A worker records into a ``Recorder`` and periodically hands a *delta* (encoded histograms and the
records since the last delta) to whoever aggregates: the master in a distributed run, or the same
process in a local one. The aggregate side is ``MetricsAggregate``: it merges deltas exactly with
``decode_and_add`` (never averaging percentiles), keeps cumulative histograms for live views and
SLO checks, and interval histograms for ``metrics.hlog``.

Histogram values are µs, 1 µs .. 1 h, 3 significant digits (DESIGN §4). Values outside the range
are clamped, because hdrh silently drops them. Which values a request contributes is
``analysis.records.metric_values``: one definition for the recorder and for any rebuild from
``requests.jsonl``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from hdrh.histogram import HdrHistogram

from analysis.hlog import clamp_us, new_histogram
from analysis.records import RequestRecord, histogram_tag, metric_values, parse_histogram_tag


@dataclass
class Delta:
    """What a worker ships per report: encoded histogram deltas keyed by tag, and new records."""

    histograms: dict[str, str] = field(default_factory=dict)
    records: list[dict] = field(default_factory=list)

    def to_wire(self) -> dict:
        return {"h": self.histograms, "r": self.records}

    @classmethod
    def from_wire(cls, data: dict) -> Delta:
        return cls(histograms=dict(data.get("h") or {}), records=list(data.get("r") or []))


class Recorder:
    """Worker-side recorder. ``record_request`` is the only call on the request path."""

    def __init__(self) -> None:
        self._delta: dict[str, HdrHistogram] = {}
        self._records: list[RequestRecord] = []

    def record(self, metric: str, value_us: int, turn_class: str, tenant: str, target: str) -> None:
        tag = histogram_tag(metric, turn_class, tenant, target)
        h = self._delta.get(tag)
        if h is None:
            h = self._delta[tag] = new_histogram()
        h.record_value(clamp_us(value_us))

    def record_request(self, rec: RequestRecord) -> None:
        hists = self._delta
        prefix_labels = (rec.turn_class, rec.tenant, rec.target)
        for metric, value in metric_values(rec):
            tag = histogram_tag(metric, *prefix_labels)
            h = hists.get(tag)
            if h is None:
                h = hists[tag] = new_histogram()
            h.record_value(clamp_us(value))
        self._records.append(rec)

    def take_delta(self) -> Delta:
        """Encode and clear everything recorded since the last call (for the wire)."""
        hists, records = self.take()
        return Delta(histograms={tag: h.encode() for tag, h in hists.items()}, records=[r.to_dict() for r in records])

    def take(self) -> tuple[dict[str, HdrHistogram], list[RequestRecord]]:
        """Hand over and clear everything recorded since the last call (same process, no encoding)."""
        hists = {tag: h for tag, h in self._delta.items() if h.get_total_count()}
        # New histograms rather than reset(): reset walks the whole counts array (~0.8 ms each).
        self._delta = {}
        records, self._records = self._records, []
        return hists, records

    def reset(self) -> None:
        self._delta = {}
        self._records = []


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
        self._last_by_metric: dict[str, HdrHistogram] = {}

    def merge(self, delta: Delta) -> list[RequestRecord]:
        """Merge a worker's encoded delta (decode_and_add: exact)."""
        for tag, payload in delta.histograms.items():
            for table in (self.cumulative, self.interval):
                h = table.get(tag)
                if h is None:
                    h = table[tag] = new_histogram()
                h.decode_and_add(payload)
        return self._count([RequestRecord.from_dict(d) for d in delta.records])

    def merge_local(self, hists: dict[str, HdrHistogram], records: list[RequestRecord]) -> list[RequestRecord]:
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
        return records

    def take_interval(self) -> dict[str, HdrHistogram]:
        """The interval histograms since the last call (per tag), and start a new interval."""
        out = {tag: h for tag, h in self.interval.items() if h.get_total_count()}
        self.interval = {}
        by_metric: dict[str, HdrHistogram] = {}
        for tag, h in out.items():
            metric = parse_histogram_tag(tag)[0]
            if metric not in by_metric:
                by_metric[metric] = new_histogram()
            by_metric[metric].add(h)
        self._last_by_metric = by_metric
        return out

    def last_interval_by_metric(self) -> dict[str, HdrHistogram]:
        """The last taken interval merged over labels, per metric (for live charts)."""
        return self._last_by_metric

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
