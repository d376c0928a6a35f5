"""The LLM tab's charts: ticks at round values, one line per percentile and turn class from the
history points, each percentile SLO marked, labels escaped."""

from __future__ import annotations

import re

from loadgen.live.live_charts import charts_html, metric_series, nice_ticks, svg_chart


def test_ticks_are_round_and_cover_the_top() -> None:
    assert nice_ticks(37.2) == [0, 10, 20, 30, 40]
    assert nice_ticks(0.8) == [0.0, 0.2, 0.4, 0.6, 0.8]
    assert nice_ticks(1234) == [0, 500, 1000, 1500]
    assert nice_ticks(0) == [0.0, 1.0]
    for top in (0.013, 7, 99.9, 250, 10_001):
        ticks = nice_ticks(top)
        assert ticks[0] == 0 and ticks[-1] >= top and len(ticks) <= 6


HISTORY = [
    {"t": 1.0, "ttft": {"all": [10.0, 20.0, 30.0], "first": [12.0, 25.0, 31.0]}, "coalesced_share": 0.01},
    {"t": 2.0, "ttft": {"all": [11.0, 21.0, 33.0], "follow-up": [5.0, 9.0, 10.0]}, "coalesced_share": 0.07},
    {"t": 3.0},
]


def test_each_line_takes_its_percentile_and_turn_class() -> None:
    lines = {label: pts for label, _colour, _dashed, pts in metric_series(HISTORY, "ttft")}
    assert lines["p50"] == [(1.0, 10.0), (2.0, 11.0)]
    assert lines["p99"] == [(1.0, 30.0), (2.0, 33.0)]
    assert lines["p95 first"] == [(1.0, 25.0)]
    assert lines["p95 follow-up"] == [(2.0, 9.0)]


def test_the_charts_mark_slos_and_the_coalescing_bound_and_escape_labels() -> None:
    out = charts_html(HISTORY, [("ttft", "TTFT"), ("itl", "I<T>L")], {"ttft": [("ttft_p99=40ms", 40.0)]})
    assert out.count("<svg") == 2  # TTFT and the coalesced reads; ITL has no data yet
    assert "I&lt;T&gt;L" in out and "I<T>L" not in out
    assert out.count('class="slo"') == 2  # the SLO and the 5% bound
    ttft = out[: out.index("I&lt;T&gt;L")]
    # the axis reaches the SLO's 40 ms; time ticks over the points' span, in s since the start
    assert re.findall(r'class="ytick"[^>]*>([^<]+)<', ttft) == ["0", "20", "40", "60"]
    assert re.findall(r'class="xtick"[^>]*>([^<]+)<', ttft) == ["1s", "1.2s", "1.4s", "1.6s", "1.8s", "2s"]


def test_a_chart_without_points_says_so() -> None:
    assert "no data yet" in svg_chart("x", [("p50", "#000", False, [])])
