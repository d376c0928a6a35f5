"""loadgen.commands.ab and loadgen.commands.demo without processes: arms, the side-by-side table, the headlines."""

from __future__ import annotations

import orjson
import pytest

from loadgen.commands.ab import (
    follow_up_ttft_factors,
    headline,
    load_summary,
    parse_arms,
    replica_lines,
    report_ab,
    run_ab,
    side_by_side,
)
from loadgen.commands.demo import demo_options, expectation_line
from loadgen.commands.run import RunOptions
from loadgen.errors import UserError


def summary(first_ms: float, follow_mean_ms: float, follow_p95_ms: float) -> dict:
    def group(mean: float, p95: float) -> dict:
        return {"metrics": {"ttft": {"mean": mean, "p50": mean * 0.8, "p95": p95, "p99": p95 * 1.1}}}

    return {
        **group(follow_mean_ms, follow_p95_ms),
        "by_turn_class": {
            "first": group(first_ms, first_ms),
            "follow-up": group(follow_mean_ms, follow_p95_ms),
        },
    }


def test_parse_arms():
    assert parse_arms("rr=sglang:round_robin, ca=sglang:cache_aware") == [
        ("rr", "sglang:round_robin"),
        ("ca", "sglang:cache_aware"),
    ]
    with pytest.raises(UserError, match=r"^--arms: 'rr' is not NAME=ROUTER; use e\.g\. "):
        parse_arms("rr,ca=sglang")
    with pytest.raises(UserError, match="at least two arms"):
        parse_arms("rr=sglang:round_robin")
    with pytest.raises(UserError, match=r"arm names must differ \(got a, a\)"):
        parse_arms("a=sglang,a=vllm")


def test_run_ab_refuses_a_given_target():
    with pytest.raises(UserError, match="starts a fresh fleet per arm; drop --target"):
        run_ab(parse_arms("a=sglang,b=vllm"), RunOptions(target="http://127.0.0.1:1"))


def test_side_by_side_and_headline():
    names = ["round_robin", "cache_aware"]
    sums = [summary(400, 120, 400), summary(400, 40, 50)]
    table = side_by_side(names, sums).splitlines()
    assert table[0].split() == [
        "metric",
        "turns",
        "stat",
        "round_robin",
        "cache_aware",
        "cache_aware/round_robin",
    ]
    row = next(line for line in table if line.startswith("ttft    follow-up  p95"))
    assert row.split()[-3:] == ["400ms", "50.0ms", "0.12x"]
    assert headline(names, sums) == (
        "cache_aware vs round_robin: follow-up-turn TTFT mean 3.0x lower (120ms -> 40.0ms), "
        "p95 8.0x lower (400ms -> 50.0ms)"
    )
    assert "2.0x higher" in headline(["a", "b"], [summary(1, 10, 10), summary(1, 20, 20)])
    assert follow_up_ttft_factors(sums[0], sums[1]) == {"mean": 3.0, "p95": 8.0}
    assert follow_up_ttft_factors(sums[0], {"metrics": {}}) == {"mean": None, "p95": None}


def write_arm(d, follow_mean_ms: float, served: tuple[int, int]) -> None:
    d.mkdir()
    (d / "summary.json").write_bytes(orjson.dumps(summary(400, follow_mean_ms, follow_mean_ms * 2)))
    metrics = {
        f"replica-{i}": {
            "url": f"http://127.0.0.1:{i + 1}/metrics",
            "during_run": {"engine": "sim", "prefix_cache_hit_rate": 0.5 + i / 4},
            "counters": {
                'sim:requests_total{model_name="m"}': float(n),
                'sim:prompt_tokens_total{model_name="m"}': 9.0,
            },
        }
        for i, n in enumerate(served)
    }
    metrics["router"] = {"url": "http://127.0.0.1:9/metrics", "during_run": {}, "counters": {"x_total": 1.0}}
    metrics["replica-2"] = {"url": "http://127.0.0.1:3/metrics", "note": "no /metrics page could be read"}
    (d / "server-metrics.json").write_bytes(orjson.dumps(metrics))


def test_report_ab_shows_the_table_the_spread_and_the_headline(tmp_path):
    a, b = tmp_path / "x-rr", tmp_path / "x-ca"
    write_arm(a, 120, (10, 9))
    write_arm(b, 40, (9, 10))
    assert replica_lines(["rr", "ca"], [a, b]).splitlines() == [
        "rr  replica-0 10 requests (prefix-cache hits 50%), replica-1 9 requests (prefix-cache hits 75%)",
        "ca  replica-0 9 requests (prefix-cache hits 50%), replica-1 10 requests (prefix-cache hits 75%)",
    ]
    text = report_ab(["rr", "ca"], [a, b])
    assert "requests per replica (from each replica's /metrics)" in text
    assert "ca vs rr: follow-up-turn TTFT mean 3.0x lower" in text
    assert text.endswith(f"results: {a}, {b}")
    (b / "server-metrics.json").unlink()
    assert "\nca  replica-0" not in report_ab(["rr", "ca"], [a, b])


def test_an_arm_without_a_summary_is_one_line(tmp_path):
    with pytest.raises(
        UserError, match=r"no summary\.json; the arm did not finish \(see its output above\)$"
    ):
        load_summary(tmp_path)


def test_demo_runs_one_session_per_agent():
    full, quick = demo_options(quick=False, results="r"), demo_options(quick=True, results="r")
    assert (full.concurrency, full.num_sessions, full.replicas) == (8, 8, 2)
    assert (quick.concurrency, quick.num_sessions) == (4, 4)
    assert (
        full.workload == "demo-agents" and full.profile == "laptop-qwen2.5-1.5b-q4" and full.time_scale == 1.0
    )


def test_demo_schedule_lag_bound_per_engine_and_overridden():
    assert demo_options(quick=True, results="r").max_schedule_lag == "50ms"
    assert demo_options(quick=True, results="r", engine="llama-server").max_schedule_lag == "200ms"
    for engine in ("sim", "llama-server"):
        opts = demo_options(quick=True, results="r", engine=engine, max_schedule_lag="70ms")
        assert opts.max_schedule_lag == "70ms"


def test_expectation_line():
    assert expectation_line({"mean": 3.2, "p95": 7.0}).startswith(
        "expected shape: follow-up-turn TTFT lower with cache_aware at mean >= 2.5x (3.2x), p95 >= 4x (7.0x): met\n"
    )
    assert "p95 >= 4x (3.9x): NOT met" in expectation_line({"mean": 3.2, "p95": 3.9})
    assert "mean >= 2.5x (-)" in expectation_line({"mean": None, "p95": 5.0})
