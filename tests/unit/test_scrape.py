"""Prometheus text parsing, counter windows and the engine-aware picks, on real-format pages."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from targets.scrape import (
    Histogram,
    diff,
    engine_of,
    mean_queue_time_s,
    parse_text,
    prefix_cache_hit_rate,
    queue_depth,
    summarize,
)

PAGES = Path(__file__).resolve().parent.parent / "fixtures" / "transcripts" / "metrics"


def page(name: str):
    return parse_text((PAGES / f"{name}.prom").read_text())


def test_types_help_and_suffixed_samples_join_their_family():
    m = page("vllm")
    assert m.invalid_lines == 0
    fam = m.families["vllm:request_queue_time_seconds"]
    assert fam.type == "histogram"
    assert fam.help == "Histogram of time spent in WAITING phase for request."
    assert {s.name for s in fam.samples} == {
        "vllm:request_queue_time_seconds_bucket",
        "vllm:request_queue_time_seconds_count",
        "vllm:request_queue_time_seconds_sum",
    }
    assert m.families["vllm:prefix_cache_queries_total"].type == "counter"
    assert m.families["vllm:prefix_cache_queries_created"].type == "gauge"
    s = m.samples("vllm:request_success_total", finished_reason="length")[0]
    assert s.value == 40.0 and s.label("engine") == "0"
    assert s.labels == (
        ("engine", "0"),
        ("finished_reason", "length"),
        ("model_name", "meta-llama/Llama-3.1-8B-Instruct"),
    )


def test_label_escapes_special_values_and_timestamps():
    text = "\n".join(
        [
            "# HELP x_total A \\\\ backslash and\\na newline.",
            "# TYPE x_total counter",
            'x_total{path="C:\\\\dir",quote="say \\"hi\\"",nl="a\\nb",} 3 1712345678000',
            "x_total{} 1e3",
            "up NaN",
            'temp{le="+Inf"} +Inf',
            "neg -Inf",
            "# EOF",
        ]
    )
    m = parse_text(text)
    assert m.invalid_lines == 0
    assert m.families["x_total"].help == "A \\ backslash and\na newline."
    s = m.samples("x_total", quote='say "hi"')[0]
    assert s.label("path") == "C:\\dir" and s.label("nl") == "a\nb" and s.timestamp_ms == 1712345678000
    assert m.value("x_total") == 1003.0
    assert math.isnan(m.samples("up")[0].value) and m.value("up") is None
    assert m.value("temp") == math.inf and m.value("neg") == -math.inf


def test_bad_lines_are_counted_not_fatal():
    m = parse_text('good 1\nbad{x="1" 2\nworse{=} 3\n9bad 1\nno_value\nalso_good{a="b"} 2\n')
    assert m.invalid_lines == 4
    assert m.value("good") == 1 and m.value("also_good", a="b") == 2


def test_value_aggregates_and_histograms():
    m = parse_text(
        'h_bucket{le="0.1",rank="0"} 1\nh_bucket{le="0.1",rank="1"} 3\n'
        'h_bucket{le="1",rank="0"} 2\nh_bucket{le="1",rank="1"} 6\n'
        'h_bucket{le="+Inf",rank="0"} 2\nh_bucket{le="+Inf",rank="1"} 6\n'
        'h_sum{rank="0"} 1\nh_sum{rank="1"} 3\nh_count{rank="0"} 2\nh_count{rank="1"} 6\n'
        'g{rank="0"} 0.5\ng{rank="1"} 0.7\n'
    )
    h = m.histogram("h")
    assert h == Histogram(((0.1, 4.0), (1.0, 8.0), (math.inf, 8.0)), 4.0, 8.0)
    assert h.mean == 0.5 and h.quantile(0.5) == pytest.approx(0.1) and h.quantile(0.75) == pytest.approx(0.55)
    assert m.histogram("h", rank="0").count == 2
    assert m.value("g", agg="max") == 0.7 and m.value("g", agg="mean") == pytest.approx(0.6)
    assert m.histogram("missing") is None


def test_vllm_picks():
    m = page("vllm")
    assert engine_of(m) == "vllm"
    assert prefix_cache_hit_rate(m) == 0.75  # 9000 hit tokens of 12000 queried
    assert mean_queue_time_s(m) == pytest.approx(0.15)
    assert queue_depth(m) == 2.0


def test_sglang_picks():
    m = page("sglang")
    assert engine_of(m) == "sglang"
    assert prefix_cache_hit_rate(m) == pytest.approx(6.0e6 / 8.128902e6)  # counters beat the gauge
    assert mean_queue_time_s(m) == pytest.approx(0.125)
    assert queue_depth(m) == 4.0
    gauge_only = parse_text('sglang:cache_hit_rate{model_name="m"} 0.4\n')
    assert prefix_cache_hit_rate(gauge_only) == 0.4
    percent = parse_text('sglang:cache_hit_rate{name="m"} 10.61\n')  # some versions export percent
    assert prefix_cache_hit_rate(percent) == pytest.approx(0.1061)


def test_llama_server_and_sim_picks():
    m = page("llamacpp")
    assert summarize(m) == {
        "engine": "llama.cpp",
        "prefix_cache_hit_rate": None,
        "mean_queue_time_s": None,
        "queue_depth": 3.0,
        "mean_ttft_s": None,
        "preemptions": None,
    }
    s = page("sim")
    assert engine_of(s) == "sim" and prefix_cache_hit_rate(s) == 0.25 and queue_depth(s) == 1


def test_llama_server_cached_prompt_tokens_give_the_hit_rate():
    # Recorded from the real llama-server (tests/fixtures/llamacpp/): a 1,110-token prompt sent twice.
    real = parse_text((PAGES.parents[1] / "llamacpp" / "metrics.txt").read_text())
    assert real.value("llamacpp:prompt_tokens_cached_total") == 1108
    assert prefix_cache_hit_rate(real) == pytest.approx(1108 / (1108 + 1110))
    window = diff(
        parse_text("llamacpp:prompt_tokens_total 100\nllamacpp:prompt_tokens_cached_total 0\n"), real
    )
    assert prefix_cache_hit_rate(window) == pytest.approx(1108 / (1108 + 1010))
    idle = parse_text("llamacpp:prompt_tokens_total 0\nllamacpp:prompt_tokens_cached_total 0\n")
    assert prefix_cache_hit_rate(idle) is None


def test_diff_gives_the_window_and_handles_resets():
    before = page("vllm")
    after_text = (PAGES / "vllm.prom").read_text()
    after_text = after_text.replace(
        'vllm:prefix_cache_queries_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 12000.0',
        'vllm:prefix_cache_queries_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 14000.0',
    ).replace(
        'vllm:prefix_cache_hits_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 9000.0',
        'vllm:prefix_cache_hits_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 10500.0',
    )
    after_text += 'vllm:num_preemptions_total{engine="1",model_name="m"} 2.0\n'
    after_text = after_text.replace(
        'vllm:generation_tokens_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 2560.0',
        'vllm:generation_tokens_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 100.0',
    )
    window = diff(before, parse_text(after_text))
    assert prefix_cache_hit_rate(window) == 0.75  # 1500 of 2000 in the window
    assert window.value("vllm:generation_tokens_total") == 100.0  # reset: the new value is the increase
    assert window.value("vllm:num_preemptions_total", engine="1") == 2.0  # new series counts from zero
    assert window.value("vllm:request_queue_time_seconds_count") == 0.0
    assert queue_depth(window) is None  # gauges are not in a window
    assert "vllm:prefix_cache_queries_created" not in window
