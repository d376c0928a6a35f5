"""summary.json: every formula against numbers worked out by hand (tests/fixtures/results/tiny.py)."""

from __future__ import annotations

import csv
import io

import numpy as np
import orjson
import pytest

from analysis import hlog
from analysis.records import REQUESTS_FILE, SUMMARY_FILE
from analysis.summary import summarize, write_summary
from analysis.summary_format import format_summary, summary_to_csv
from tests.fixtures.results.synth import record, write_run
from tests.fixtures.results.tiny import TINY_DIR, tiny_records, write_tiny


def _hdr_ms(values_ms, p):
    h = hlog.new_histogram()
    for v in values_ms:
        h.record_value(hlog.clamp_us(v * 1000))
    return h.get_value_at_percentile(p) / 1000


@pytest.fixture(scope="module")
def tiny():
    return summarize(TINY_DIR)


def test_fixture_on_disk_matches_its_builder(tmp_path):
    write_tiny(tmp_path)
    assert (tmp_path / REQUESTS_FILE).read_bytes() == (TINY_DIR / REQUESTS_FILE).read_bytes()


def test_window_and_counts(tiny):
    assert tiny["window"] == {
        "start_s": 2.0,
        "end_s": 10.0,
        "length_s": 8.0,
        "end_source": "duration_s",
        "warmup_s": 2.0,
    }
    # measured: intended after warm-up (r1..r5), drain included; finished in [2, 10): r6, r1, r2, r3, r4
    assert tiny["requests"] == {
        "measured": 5,
        "ok": 4,
        "errors": 1,
        "finished_in_window": 5,
        "ok_finished_in_window": 4,
    }


def test_throughput_counts_what_finished_in_the_window(tiny):
    tp = tiny["throughput"]
    assert tp["requests_per_s"] == 4 / 8  # r6, r1, r2, r3
    assert tp["output_tokens"] == 2 + 3 + 4 + 2
    assert tp["output_tokens_per_s"] == 11 / 8
    assert tp["input_tokens_per_s"] == (100 + 100 + 150 + 50) / 8


def test_errors_by_category(tiny):
    assert tiny["errors"] == {
        "total": 1,
        "rate": 0.2,
        "by_category": {"http_429": 1},
        "server_faults": 1,  # a 429 is the server refusing load, not a bad request
        "client_errors": 0,
        "generator_network": 0,
        "cut_at_stop": 0,
        "throttled_retries": 0,
    }


def test_attainment_counts_errors_as_misses_and_goodput(tiny):
    slo = tiny["slo"]
    assert slo["requests_meeting"] == 2  # r1, r2 of r1..r5
    assert slo["attainment"] == 0.4
    # finishing rate (r6, r1, r2, r3, r4 in 8 s) x attainment
    assert slo["goodput_requests_per_s"] == pytest.approx(5 / 8 * 0.4)
    # output tokens/s x the share of measured output tokens from requests meeting the SLOs (r1, r2 of r1, r2, r3, r5)
    assert slo["goodput_tokens_per_s"] == pytest.approx(11 / 8 * (3 + 4) / (3 + 4 + 2 + 3), abs=1e-3)
    assert slo["percentile"] == [
        {"slo": "ttft_p99=1s", "metric": "ttft", "stat": "p99", "limit_ms": 1000.0, "observed_ms": pytest.approx(900, rel=1e-3), "ok": True}
    ]  # fmt: skip
    assert slo["percentile_ok"] is True


def test_tokens_per_dollar_and_dollars_per_million(tiny):
    cost = tiny["cost"]
    assert cost["cost_per_hour_usd"] == 3.6
    assert cost["output_tokens_per_usd"] == pytest.approx((11 / 8) / (3.6 / 3600))  # 1375
    assert cost["usd_per_1m_output_tokens"] == pytest.approx(
        (3.6 / 3600) / (11 / 8) * 1e6, rel=1e-6
    )  # 727.27
    assert cost["goodput_tokens_per_usd"] == pytest.approx(11 / 8 * 7 / 12 / (3.6 / 3600), rel=1e-3)
    assert tiny["by_target"]["a"]["cost"] == cost


def test_latency_excludes_warmup_and_matches_hdrh(tiny):
    m = tiny["metrics"]
    assert tiny["histogram_source"] == "requests.jsonl"  # warm-up can only be cut from records
    ttft = [200, 300, 900, 400]  # r1, r2, r3, r5: never r0/r6 (warm-up) nor r4 (error)
    tpot = [100 / 2, 90 / 3, 100 / 1, 400 / 2]
    itl = [40, 60, 30, 30, 30, 100, 200, 200]
    for name, values in (("ttft", ttft), ("tpot", tpot), ("itl", itl)):
        assert m[name]["count"] == len(values)
        for p in (50, 90, 99):
            assert m[name][f"p{p}"] == _hdr_ms(values, p)
        assert m[name]["mean"] == pytest.approx(np.mean(values), rel=2e-3)
    assert m["e2e"]["max"] == pytest.approx(1000, rel=1e-3)  # r3: 900 ms + 100 ms
    assert m["schedule_lag"]["count"] == 5  # errors were sent too
    assert m["tokens_per_chunk"]["unit"] == "tokens"


def test_split_by_turn_class_and_labels(tiny):
    first, follow = tiny["by_turn_class"]["first"], tiny["by_turn_class"]["follow-up"]
    assert first["requests"]["measured"] == 3 and follow["requests"]["measured"] == 2
    assert first["metrics"]["ttft"]["count"] == 2 and follow["metrics"]["ttft"]["count"] == 2
    assert first["slo"]["attainment"] == pytest.approx(1 / 3, abs=1e-6)
    assert follow["slo"]["attainment"] == 0.5
    assert first["cost"] is None  # a turn class has no price of its own
    assert list(tiny["by_model"]) == ["m1"] and list(tiny["by_hardware"]) == ["cpu"]
    assert tiny["by_tenant"]["default"]["requests"]["measured"] == 5


def test_histograms_from_hlog_equal_hdrh_merge(tmp_path):
    """No warm-up: percentiles come from metrics.hlog, merged exactly across tags and intervals."""
    rng = np.random.default_rng(3)
    recs, ttft_all = [], []
    for i in range(400):
        ttft = float(rng.lognormal(5, 0.8))
        ttft_all.append(ttft)
        recs.append(
            record(
                i, i % 3, sched_ms=i * 20, ttft_ms=ttft, itl_ms=[20.0], tenant=f"t{i % 2}", target="ab"[i % 2]
            )
        )
    write_run(tmp_path, recs, duration_s=10.0, interval_s=0.5)
    s = summarize(tmp_path)
    assert s["histogram_source"] == "metrics.hlog"
    direct = hlog.new_histogram()
    for r in recs:
        direct.record_value(r.ttft_us)
    for p in (50, 90, 95, 99, 99.9):
        assert s["metrics"]["ttft"][f"p{p:g}"] == direct.get_value_at_percentile(p) / 1000
    assert s["metrics"]["ttft"]["max"] == direct.get_max_value() / 1000
    assert s["metrics"]["ttft"]["mean"] == pytest.approx(direct.get_mean_value() / 1000, abs=1e-3)
    assert set(s["by_target"]) == {"a", "b"}
    assert s["by_target"]["b"]["metrics"]["ttft"]["count"] == 200


def test_costs_per_target_and_override(tmp_path):
    recs = [
        record(i, 0, sched_ms=i * 100, ttft_ms=50, itl_ms=[10] * 9, target="ab"[i % 2]) for i in range(40)
    ]
    targets = [
        {"label": "a", "cost_per_hour_usd": 2.0, "labels": {"hardware": "x"}},
        {"label": "b", "cost_per_hour_usd": 6.0},
    ]
    write_run(tmp_path, recs, duration_s=5.0, targets=targets)
    s = summarize(tmp_path)
    # each target: 20 requests x 10 tokens over 5 s = 40 tokens/s
    assert s["by_target"]["a"]["cost"]["output_tokens_per_usd"] == pytest.approx(40 / (2.0 / 3600))
    assert s["by_target"]["b"]["cost"]["usd_per_1m_output_tokens"] == pytest.approx((6.0 / 3600) / 40 * 1e6)
    assert s["cost"]["cost_per_hour_usd"] == 8.0  # the fleet: both targets at once
    assert s["cost"]["output_tokens_per_usd"] == pytest.approx(80 / (8.0 / 3600))
    assert (
        summarize(tmp_path, cost_per_hour_usd={"a": 1.0})["by_target"]["a"]["cost"]["cost_per_hour_usd"]
        == 1.0
    )
    assert summarize(tmp_path, cost_per_hour_usd=3.0)["cost"]["cost_per_hour_usd"] == 6.0
    targets[1]["cost_per_hour_usd"] = None
    write_run(tmp_path, recs, duration_s=5.0, targets=targets)
    assert summarize(tmp_path)["cost"] is None  # an unpriced target leaves the fleet unpriced


def test_slos_argument_replaces_the_runs(tmp_path):
    s = summarize(TINY_DIR, slos="ttft=1s,e2e_p99.9=2s")
    assert s["slos"] == ["e2e_p99.9=2s", "ttft=1s"]
    assert s["slo"]["attainment"] == 0.8  # only the 429 misses
    assert "p99.9" in s["metrics"]["e2e"]
    assert summarize(TINY_DIR, slos="")["slo"]["attainment"] is None


def test_generator_saturation_flag(tmp_path):
    recs = [record(i, 0, sched_ms=i * 10, lag_ms=25 if i % 10 == 0 else 0.2, ttft_ms=50) for i in range(100)]
    write_run(tmp_path, recs)
    s = summarize(tmp_path)
    assert s["generator"]["schedule_lag_p99_ms"] == pytest.approx(25, rel=1e-3)
    assert s["generator_saturated"] is True and any("saturated" in n for n in s["notes"])
    assert summarize(tmp_path, saturation_lag_ms=30)["generator_saturated"] is False
    write_run(tmp_path, recs, max_schedule_lag_us=50_000)
    assert summarize(tmp_path)["generator"]["saturation_bound_ms"] == 50.0


def test_partial_run_without_duration(tmp_path):
    recs = tiny_records()
    write_run(tmp_path, recs, status="running", duration_s=None, ended_at=None)
    with open(tmp_path / REQUESTS_FILE, "ab") as f:
        f.write(b'{"request_id": "r9", "session_')  # killed mid-line
    s = summarize(tmp_path)
    assert s["partial"] is True and "running" in s["partial_reason"]
    assert s["window"]["end_source"] == "last request" and s["window"]["end_s"] == 10.3
    assert s["requests"]["measured"] == 7
    assert any("truncated" in n for n in s["notes"])
    assert "PARTIAL" in format_summary(s)


def test_partial_run_that_stopped_early_uses_what_it_recorded(tmp_path):
    write_run(tmp_path, tiny_records(), status="running", warmup_s=2.0, duration_s=60.0)  # crashed at ~10 s
    s = summarize(tmp_path)
    assert s["window"]["end_s"] == 10.3 and s["window"]["end_source"] == "last request"
    assert s["throughput"]["requests_per_s"] == pytest.approx(
        5 / 8.3, abs=1e-3
    )  # r6 r1 r2 r3 r5 in [2, 10.3]


def test_complete_run_that_ended_early_uses_its_last_request(tmp_path):
    """Every session finished at about 10.5 s of a planned 60 s: rates are over [2 s, 10.3 s]."""
    write_run(
        tmp_path, tiny_records(), warmup_s=2.0, duration_s=60.0, ended_at="2023-11-14T22:13:30.500+00:00"
    )
    assert summarize(tmp_path)["window"]["end_s"] == 10.3
    write_run(
        tmp_path, tiny_records(), warmup_s=2.0, duration_s=10.0, ended_at="2023-11-14T22:13:35.000+00:00"
    )
    assert summarize(tmp_path)["window"]["end_s"] == 10.0  # ran its course, drain after


def test_closed_loop_mode_is_shown(tmp_path):
    write_run(tmp_path, tiny_records(), mode="closed-loop", arrival={"kind": "closed-loop", "concurrency": 4})
    s = summarize(tmp_path)
    assert s["mode"] == "closed-loop"
    assert "closed-loop, concurrency 4" in format_summary(s)


def test_format_and_csv(tiny):
    text = format_summary(tiny)
    assert "ttft" in text and "by turn class" in text and "attainment 40.0%" in text
    assert "$727.27 per 1M output tokens" in text
    rows = list(csv.DictReader(io.StringIO(summary_to_csv(tiny))))
    by_key = {(r["scope"], r["group"], r["metric"], r["stat"]): r for r in rows}
    assert float(by_key[("all", "", "throughput", "output_tokens_per_s")]["value"]) == 11 / 8
    assert by_key[("turn_class", "follow-up", "ttft", "count")]["value"] == "2"
    assert by_key[("all", "", "errors", "http_429")]["value"] == "1"


def test_write_summary(tmp_path):
    write_tiny(tmp_path)
    path = write_summary(tmp_path)
    assert path == tmp_path / SUMMARY_FILE
    data = orjson.loads(path.read_bytes())
    assert data["schema_version"] == 1 and data["run_id"] == "tiny"
    assert format_summary(path) == format_summary(data)  # the path of summary.json works too
