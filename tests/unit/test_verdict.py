"""verdict_from_summary: the exit code and the one-line reason, from summary.json (and run.json)."""

from __future__ import annotations

from typing import Any

from loadgen.runtime.verdict import (
    EXIT_GENERATOR_SATURATED,
    EXIT_INCOMPLETE,
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


def test_a_lost_worker_with_nothing_in_flight_is_named_and_the_run_stands() -> None:
    # Its arrivals not yet due were re-planned onto the others, and nothing of it was on the wire.
    info = {"config": {"on_worker_loss": "continue"}, "status": "complete", "lost_workers": [{"worker": "w1", "slot": 2}]}
    v = verdict_from_summary(summary(), [], info)
    assert v.exit_code == EXIT_OK
    assert v.line.endswith("no failures; 1 worker lost (slot 2) with nothing in flight, its later arrivals sent by the others")


def test_a_lost_worker_with_sessions_in_flight_makes_the_run_incomplete() -> None:
    lost = [{"worker": "w1", "slot": 2, "in_flight_sessions": ["s-3", "s-5"]}, {"worker": "w3", "slot": 0}]
    v = verdict_from_summary(summary(errors=1), [], {"status": "complete", "lost_workers": lost})
    assert v.exit_code == EXIT_INCOMPLETE
    assert v.reason == "run incomplete: 1 worker lost (slot 2) with 2 sessions in flight, whose unreported requests are missing"


def test_an_aborted_run_exits_5_with_its_reason_whatever_else_it_measured() -> None:
    for reason in (
        "worker w1 lost (missed heartbeats) and --on-worker-loss abort stopped the run",
        "every worker was lost",
        "stopped by a signal (SIGTERM) after 9.0 s, before its planned end",
    ):
        info = {"status": "aborted", "abort_reason": reason}
        v = verdict_from_summary(summary(ttft_p99_ms=800.0, errors=3, lag_p99_ms=25.0), ["ttft_p99=500ms"], info)
        assert v.exit_code == EXIT_INCOMPLETE
        assert v.line == f"loadgen verdict: FAIL (exit 5): run incomplete: {reason}"


def test_sessions_not_started_requests_cut_and_nothing_measured_are_incomplete() -> None:
    acc = {"arrivals_planned": 50, "sessions_not_started": {"worker lost": 13}, "outcomes": {}}
    v = verdict_from_summary(summary(), [], {"status": "complete", "accounting": acc})
    assert v.exit_code == EXIT_INCOMPLETE
    assert "13 of 50 planned sessions never started (13 worker lost)" in v.reason

    cut = summary()
    cut["errors"] = {"total": 9, "by_category": {"cut_at_stop": 9}, "cut_at_stop": 9}
    v = verdict_from_summary(cut, [], {"status": "complete", "config": {"stop_timeout_s": 30.0}})
    assert v.exit_code == EXIT_INCOMPLETE
    assert "9 requests were still on the wire when the stop's drain deadline passed (--stop-timeout 30s)" in v.reason

    v = verdict_from_summary(summary(measured=0, ttft_p99_ms=None), [], {"status": "complete"})
    assert v.exit_code == EXIT_INCOMPLETE
    assert "nothing was measured" in v.reason


def test_every_reply_empty_is_an_invalid_run_not_a_pass() -> None:
    s = summary(errors=42, measured=42)
    s["errors"]["by_category"] = {"empty_reply": 42}
    v = verdict_from_summary(s, [], {"status": "complete"})
    assert v.exit_code == EXIT_INCOMPLETE
    assert "every reply was empty (42 requests, 0 generated tokens)" in v.reason


def test_a_lost_worker_that_came_back_is_named_as_back_and_is_not_a_lost_run() -> None:
    workers = [{"id": "w0", "slot": 0}]
    back = {"worker": "w0", "slot": 0, "lost_at_s": 4.8, "returned_at_s": 4.9}
    v = verdict_from_summary(summary(), [], {"config": {}, "workers": workers, "lost_workers": [back]})
    assert v.exit_code == EXIT_OK
    assert v.line.endswith("no failures; 1 worker lost (slot 0) and back, whose late reports were merged")


def test_a_worker_back_and_then_lost_again_with_sessions_in_flight_makes_the_run_incomplete() -> None:
    # Its first return was merged; the second loss left sessions unreported.
    again = {"worker": "w0", "slot": 0, "lost_at_s": 4.8, "returned_at_s": 4.9, "in_flight_sessions": [],
             "lost_again_at_s": 9.0, "why_again": "missed heartbeats", "in_flight_sessions_again": ["s-7"]}  # fmt: skip
    v = verdict_from_summary(summary(), [], {"config": {}, "lost_workers": [again]})
    assert v.exit_code == EXIT_INCOMPLETE
    assert v.reason == "run incomplete: 1 worker lost (slot 0) with 1 session in flight, whose unreported requests are missing"


def test_a_worker_back_and_then_lost_again_with_nothing_in_flight_is_not_called_back() -> None:
    again = {"worker": "w0", "slot": 0, "lost_at_s": 4.8, "returned_at_s": 4.9, "lost_again_at_s": 9.0,
             "in_flight_sessions_again": []}  # fmt: skip
    v = verdict_from_summary(summary(), [], {"config": {}, "lost_workers": [again]})
    assert v.exit_code == EXIT_OK
    assert "and back" not in v.line and v.line.endswith("with nothing in flight, its later arrivals sent by the others")


def test_a_clean_first_leave_says_nothing_of_a_second_loss_with_sessions_in_flight() -> None:
    again = {"worker": "w0", "slot": 0, "lost_at_s": 4.8, "left_cleanly": True, "in_flight_sessions": [],
             "returned_at_s": 4.9, "lost_again_at_s": 9.0, "in_flight_sessions_again": ["s-2", "s-4"]}  # fmt: skip
    v = verdict_from_summary(summary(), [], {"config": {}, "lost_workers": [again]})
    assert v.exit_code == EXIT_INCOMPLETE and "2 sessions in flight" in v.reason
