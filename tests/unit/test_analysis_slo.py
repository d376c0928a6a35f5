"""SLO parsing and evaluation."""

from __future__ import annotations

import pytest

from analysis.slo import PercentileSlo, RequestSlo, evaluate_percentile_slos, parse_slos
from tests.fixtures.results.synth import record


def test_parse_both_kinds():
    s = parse_slos("ttft_p99=500ms,itl_p99=50ms,ttft=1s,tpot=80ms")
    assert s.percentile == (PercentileSlo("ttft", 99.0, 500_000), PercentileSlo("itl", 99.0, 50_000))
    assert s.per_request == (RequestSlo("ttft", 1_000_000), RequestSlo("tpot", 80_000))
    assert str(s) == "ttft_p99=500ms,itl_p99=50ms,ttft=1s,tpot=80ms"
    assert parse_slos(["ttft_p99.9: 2s", " e2e_mean=3s", "itl_max=0.2s"]).texts() == [
        "ttft_p99.9=2s",
        "e2e_mean=3s",
        "itl_max=200ms",
    ]
    assert parse_slos("ttft_sched_p50=1s").percentile[0].metric == "ttft_sched"
    assert not parse_slos("") and not parse_slos(None)


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("ttft", "is not an SLO; use metric_pNN=duration"),
        ("latency_p99=1s", "is not an SLO; use metric_pNN=duration"),
        ("itl=50ms", "ttft|ttfot|tpot|itl_max|e2e=duration"),
        ("ttft_p99=fast", "'fast' is not a duration; use e.g. 500ms"),
        ("ttft_p101=1s", "percentile must be in (0, 100]"),
        ("ttft_p0=1s", "percentile must be in (0, 100]"),
        ("ttft=0s", "must be greater than 0"),
        ("ttft=1s,ttft=2s", "ttft is given twice"),
    ],
)
def test_bad_forms_are_one_line(spec, fragment):
    with pytest.raises(ValueError) as e:
        parse_slos(spec)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_request_slos_count_errors_as_misses():
    s = parse_slos("ttft=300ms,tpot=50ms,itl_max=60ms,e2e=1s")
    assert s.request_meets(record(0, 0, sched_ms=0, ttft_ms=200, itl_ms=[40, 60]))
    assert not s.request_meets(record(0, 0, sched_ms=0, ttft_ms=301, itl_ms=[40]))
    assert not s.request_meets(record(0, 0, sched_ms=0, ttft_ms=200, itl_ms=[40, 61]))  # itl_max
    assert not s.request_meets(record(0, 0, sched_ms=0, ttft_ms=200, itl_ms=[55, 55]))  # tpot 55
    assert not s.request_meets(record(0, 0, sched_ms=0, ttft_ms=200, itl_ms=[50], tail_ms=800))  # e2e 1.05 s
    assert not s.request_meets(record(0, 0, sched_ms=0, error="timeout"))
    assert not s.request_meets(record(0, 0, sched_ms=0, ttft_ms=100, itl_ms=[10], error="stream_cut"))
    assert s.request_meets(record(0, 0, sched_ms=0, ttft_ms=100))  # one token: no TPOT, no ITL to violate


def test_evaluate_percentile_slos():
    summary = {
        "metrics": {"ttft": {"count": 10, "p99": 480.0, "mean": 100.0}, "itl": {"count": 0, "p99": None}}
    }
    got = evaluate_percentile_slos(
        summary, "ttft_p99=500ms,ttft_mean=90ms,itl_p99=50ms,e2e_p50=1s,ttft_p99.9=1s"
    )
    assert [(str(s), obs, ok) for s, obs, ok in got] == [
        ("ttft_p99=500ms", 480.0, True),
        ("ttft_mean=90ms", 100.0, False),
        ("itl_p99=50ms", None, False),  # no values: cannot be shown to hold
        ("e2e_p50=1s", None, False),
        ("ttft_p99.9=1s", None, False),  # a statistic the summary lacks
    ]
