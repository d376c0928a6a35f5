"""verdict_from_summary: the exit code and the one-line reason, from summary.json (and run.json)."""

from __future__ import annotations

from typing import Any

from loadgen.verdict import (
    EXIT_GENERATOR_SATURATED,
    EXIT_OK,
    EXIT_REQUEST_FAILURES,
    EXIT_SLO_MISSED,
    verdict_from_summary,
)


def summary(
    *, ttft_p99_ms: float | None = 120.0, errors: int = 0, measured: int = 100, lag_p99_ms: float = 2.0, bound_ms: float = 10.0
) -> dict[str, Any]:
    ttft = {"count": 0} if ttft_p99_ms is None else {"count": measured, "unit": "ms", "p50": 40.0, "p99": ttft_p99_ms}
    return {
        "metrics": {"ttft": ttft, "itl": {"count": measured * 10, "unit": "ms", "p99": 30.0}},
        "requests": {"measured": measured, "ok": measured - errors, "errors": errors},
        "errors": {"total": errors, "by_category": {"http_5xx": errors} if errors else {}},
        "generator": {"schedule_lag_p99_ms": lag_p99_ms, "saturation_bound_ms": bound_ms, "saturated": lag_p99_ms > bound_ms},
    }


def test_pass_names_the_requests_and_the_slos_met() -> None:
    v = verdict_from_summary(summary(), ["ttft_p99=500ms", "itl_p99=50ms"])
    assert v.exit_code == EXIT_OK
    assert v.line.startswith("loadgen verdict: PASS: 100 requests, no failures; SLOs met: ")
    assert "ttft_p99" in v.line and "itl_p99" in v.line


def test_request_failures_exit_1_with_the_categories() -> None:
    v = verdict_from_summary(summary(errors=7), [])
    assert v.exit_code == EXIT_REQUEST_FAILURES
    assert v.line == "loadgen verdict: FAIL (exit 1): 7 of 100 requests failed (http_5xx 7)"


def test_a_missed_percentile_slo_exits_3_and_wins_over_failures() -> None:
    v = verdict_from_summary(summary(ttft_p99_ms=800.0, errors=3), ["ttft_p99=500ms", "itl_p99=50ms"])
    assert v.exit_code == EXIT_SLO_MISSED
    assert v.reason.startswith("SLO missed: ttft_p99")
    assert "itl_p99" not in v.reason  # only the missed one is named


def test_an_slo_without_data_does_not_hold() -> None:
    v = verdict_from_summary(summary(ttft_p99_ms=None), ["ttft_p99=500ms"])
    assert v.exit_code == EXIT_SLO_MISSED
    assert "observed none" in v.reason


def test_a_saturated_generator_exits_4_and_wins_over_everything() -> None:
    v = verdict_from_summary(summary(ttft_p99_ms=800.0, errors=3, lag_p99_ms=25.0), ["ttft_p99=500ms"])
    assert v.exit_code == EXIT_GENERATOR_SATURATED
    assert "schedule-lag p99 25.0 ms > 10.0 ms" in v.reason
    assert "--workers" in v.reason


def test_a_lost_worker_is_named_but_does_not_change_the_code_when_the_run_continued() -> None:
    info = {"config": {"on_worker_loss": "continue"}, "lost_workers": [{"worker": "w1", "slot": 2}]}
    v = verdict_from_summary(summary(), [], info)
    assert v.exit_code == EXIT_OK
    assert v.line.endswith("no failures; 1 worker lost (slot 2), whose unreported requests are missing")
    two = {**info, "lost_workers": [{"worker": "w1", "slot": 2}, {"worker": "w3", "slot": 0}]}
    assert "2 workers lost (slot 2, 0)" in verdict_from_summary(summary(errors=1), [], two).reason


def test_a_run_aborted_by_a_lost_worker_exits_4() -> None:
    info = {"config": {"on_worker_loss": "abort"}, "lost_workers": [{"worker": "w1", "slot": 1}]}
    v = verdict_from_summary(summary(), [], info)
    assert v.exit_code == EXIT_GENERATOR_SATURATED
    assert v.reason.startswith("generator failed: 1 worker lost (slot 1) and --on-worker-loss abort")
    # Without a loss, --on-worker-loss abort changes nothing.
    assert verdict_from_summary(summary(), [], {"config": {"on_worker_loss": "abort"}, "lost_workers": []}).exit_code == 0


def test_a_run_that_lost_every_worker_exits_4() -> None:
    workers = [{"id": "w0", "slot": 0}, {"id": "w1", "slot": 1}, {"id": "w2", "slot": 1}]
    lost = [{"worker": "w0", "slot": 0}, {"worker": "w1", "slot": 1}, {"worker": "w2", "slot": 1}]
    info = {"config": {"on_worker_loss": "continue"}, "workers": workers, "lost_workers": lost}
    v = verdict_from_summary(summary(), [], info)
    assert v.exit_code == EXIT_GENERATOR_SATURATED
    assert v.reason.startswith("generator failed: every worker was lost (slot 0, 1, 1); ")
    # A slot taken over by a worker that is still there is not a lost run.
    assert verdict_from_summary(summary(), [], {**info, "lost_workers": lost[:2]}).exit_code == EXIT_OK


def test_a_lost_worker_that_came_back_is_named_as_back_and_is_not_a_lost_run() -> None:
    workers = [{"id": "w0", "slot": 0}]
    back = {"worker": "w0", "slot": 0, "lost_at_s": 4.8, "returned_at_s": 4.9}
    v = verdict_from_summary(summary(), [], {"config": {}, "workers": workers, "lost_workers": [back]})
    assert v.exit_code == EXIT_OK
    assert v.line.endswith("no failures; 1 worker lost (slot 0) and back, whose late reports were merged")
