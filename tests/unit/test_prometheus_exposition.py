"""The /metrics text: exact buckets from HDR data, the exposition format, and what a run exports.

Bucket counts are checked against the raw values (not against another HDR computation): for every
``le``, the number of recorded values <= le must be the bucket's count. The text is parsed with
prometheus_client's own parser, the reference for what Prometheus accepts.
"""

from __future__ import annotations

import random

import pytest
from prometheus_client.parser import text_string_to_metric_families

from analysis.hlog import clamp_us, new_histogram
from analysis.records import ERROR_CATEGORIES, RequestRecord, metric_values
from loadgen.config import RunConfig
from loadgen.engine.recorder import MetricsAggregate, Recorder, metric_sums
from loadgen.live.exposition import (
    NOMINAL_BOUNDS_US,
    BucketLayout,
    Family,
    format_seconds,
    hdr_buckets,
    render,
)
from loadgen.live.prometheus import EXPORTED_NAMES, HISTOGRAMS, bucket_layout, collect
from loadgen.live.snapshot import RunSnapshot


def test_bucket_bounds_are_hdr_edges_near_the_nominal_ones() -> None:
    h = new_histogram()
    layout = BucketLayout.for_histogram(h)
    assert len(layout.le_us) == len(NOMINAL_BOUNDS_US)
    for nominal, le in zip(NOMINAL_BOUNDS_US, layout.le_us, strict=True):
        assert nominal <= le <= nominal * 1.001
        assert h.get_highest_equivalent_value(le) == le  # the top of an HDR range: counts split here
    # Below 2,048 µs HDR keeps every µs apart: the nominal bounds themselves.
    assert layout.le_seconds[:4] == ("0.0001", "0.00025", "0.0005", "0.001")
    assert format_seconds(500_223) == "0.500223" and format_seconds(3_000_000) == "3"


def test_bucket_counts_equal_the_raw_values_at_each_bound() -> None:
    rng = random.Random(7)
    values = [clamp_us(rng.lognormvariate(10, 2.5)) for _ in range(5000)]
    # Values sitting exactly on and next to the edges, where an off-by-one would show.
    layout = bucket_layout()
    values += [v + d for v in layout.le_us for d in (-1, 0, 1)]
    h = new_histogram()
    for v in values:
        h.record_value(v)
    counts, total = hdr_buckets(h, layout)
    assert total == len(values)
    assert counts == [sum(1 for v in values if v <= le) for le in layout.le_us]


def test_render_parses_with_prometheus_client_and_escapes_labels() -> None:
    fam = Family("x_total", "counter", "A help\\text\nwith a newline.")
    fam.add(3, {"target": 'a"b\\c\nd'})
    fam.add(0.25, {"target": "plain"})
    text = render([fam, Family("empty", "gauge", "no samples: left out")])
    assert "empty" not in text
    (parsed,) = text_string_to_metric_families(text)
    assert parsed.type == "counter" and parsed.documentation == "A help\\text\nwith a newline."
    assert {s.labels["target"]: s.value for s in parsed.samples} == {'a"b\\c\nd': 3.0, "plain": 0.25}


def _record(i: int, turn_class: str, ok: bool = True) -> RequestRecord:
    t_send = 1_000 * i + 50
    common = dict(
        request_id=f"r{i}", session_id=f"s{i}", session_index=i, turn_index=0, turn_class=turn_class,
        tenant="team:a", target="127.0.0.1:8000", worker="w", t_sched_us=1_000 * i, t_send_us=t_send,
        prompt_tokens=100 + i,
    )  # fmt: skip
    if not ok:
        return RequestRecord(status="error", error_category="http_5xx", http_status=500, **common)
    gaps = [20_000 + 37 * i, 15_000 + i]
    return RequestRecord(
        status="ok", t_first_us=t_send + 180_000 + 1_000 * i, t_last_us=t_send + 180_000 + 1_000 * i + sum(gaps),
        t_end_us=t_send + 181_000 + 1_000 * i + sum(gaps), output_tokens=3, chunks=3, itl_us=gaps, **common,
    )  # fmt: skip


def test_a_run_exports_exact_counts_sums_and_labels() -> None:
    recorder = Recorder()
    recs = [_record(i, "first" if i % 3 == 0 else "follow-up", ok=i % 5 != 4) for i in range(40)]
    for r in recs:
        recorder.record_request(r)
    agg = MetricsAggregate()
    agg.merge(recorder.take_delta())
    rt = RunSnapshot(
        config=RunConfig(run_id="run-1", workload="tiny", seed=3, rate_per_s=2.0),
        aggregate=agg, t0_unix_s=1_700_000_000.0, t_end_unix_s=None,
        sessions_started=12, sessions_in_flight=2, requests_in_flight=1, workers={"active": 1},
    )  # fmt: skip
    fams = {f.name: f for f in text_string_to_metric_families(render(collect(rt)))}

    ok = [r for r in recs if r.ok]
    labels = {"tenant": "team_a", "target": "127.0.0.1_8000"}  # as in histogram tags
    ttft = fams["loadgen_ttft_seconds"]
    assert ttft.type == "histogram"
    for tc in ("first", "follow-up"):
        mine = [r for r in ok if r.turn_class == tc]
        got = {(s.name, s.labels.get("le")): s.value for s in ttft.samples if s.labels["turn_class"] == tc}
        assert got[("loadgen_ttft_seconds_count", None)] == len(mine)
        assert got[("loadgen_ttft_seconds_sum", None)] == pytest.approx(sum(r.ttft_us for r in mine) / 1e6, abs=1e-9)
        assert got[("loadgen_ttft_seconds_bucket", "+Inf")] == len(mine)
        le_us = bucket_layout().le_us[NOMINAL_BOUNDS_US.index(200_000)]  # 200 ms, raised to an HDR edge
        assert got[("loadgen_ttft_seconds_bucket", format_seconds(le_us))] == sum(1 for r in mine if r.ttft_us <= le_us)
    itl_count = sum(s.value for s in fams["loadgen_itl_seconds"].samples if s.name.endswith("_count"))
    assert itl_count == sum(len(r.itl_us) for r in ok)
    requests = {(s.labels["turn_class"], s.labels["status"]): s.value for s in fams["loadgen_requests"].samples}
    assert sum(requests.values()) == len(recs)
    assert sum(v for (_, st), v in requests.items() if st == "error") == len(recs) - len(ok)
    errors: dict[str, float] = {}
    for s in fams["loadgen_errors"].samples:
        errors[s.labels["category"]] = errors.get(s.labels["category"], 0) + s.value
    assert {k: v for k, v in errors.items() if v} == {"http_5xx": len(recs) - len(ok)}
    assert set(errors) == set(ERROR_CATEGORIES)  # zeros included, so rate() sees the first error
    assert sum(s.value for s in fams["loadgen_input_tokens"].samples) == sum(r.prompt_tokens for r in recs)
    assert sum(s.value for s in fams["loadgen_output_tokens"].samples) == 3 * len(ok)
    for fam in (ttft, fams["loadgen_requests"]):
        assert all(s.labels.items() >= labels.items() for s in fam.samples)
    (info,) = fams["loadgen_run_info"].samples
    assert info.labels == {
        "run_id": "run-1", "workload": "tiny", "seed": "3", "mode": "open-loop", "arrival": "poisson", "rate_per_s": "2",
    }  # fmt: skip
    assert fams["loadgen_sessions_in_flight"].samples[0].value == 2
    assert fams["loadgen_requests_in_flight"].samples[0].value == 1
    assert fams["loadgen_sessions_started"].samples[0].value == 12
    assert fams["loadgen_run_end_time_seconds"].samples[0].value == 0
    lag_p99 = fams["loadgen_schedule_lag_p99_seconds"].samples[0].value
    assert lag_p99 == pytest.approx(50e-6)  # every request was sent 50 µs late
    # Every exported name is documented in one place (the dashboard test relies on it).
    assert {name for name, _ in HISTOGRAMS.values()} <= set(EXPORTED_NAMES)


def test_no_run_yet_exports_nothing() -> None:
    rt = RunSnapshot(config=None, aggregate=MetricsAggregate(), t0_unix_s=0.0, t_end_unix_s=None)
    assert render(collect(rt)) == ""


def test_metric_sums_follow_the_recording_rule() -> None:
    """The exporter's fast per-record sums equal summing what the histograms record, case by case."""
    base = _record(3, "follow-up")
    cases = [
        base,
        _record(4, "first", ok=False),
        RequestRecord(**{**base.to_dict(), "chunk_tokens": [1, 4, 2], "itl_us": [0, 7]}),
        RequestRecord(**{**base.to_dict(), "t_first_us": None, "t_last_us": None, "itl_us": [], "chunks": 0}),
        RequestRecord(**{**base.to_dict(), "output_tokens": 1, "itl_us": [], "chunks": 1, "t_end_us": None}),
    ]
    for rec in cases:
        expected: dict[str, int] = {}
        for metric, value in metric_values(rec):
            expected[metric] = expected.get(metric, 0) + value
        assert dict(metric_sums(rec)) == expected, rec
