"""TTFOT beside TTFT in every table: the summary's group and step-kind tables, the step-kind
histograms, and the A/B side-by-side table; no column where no record carries a TTFOT."""

from __future__ import annotations

from analysis.records import RequestRecord
from analysis.sessions import step_kind_stats
from analysis.summary_format import _dag_lines, _group_table
from loadgen.commands.ab import side_by_side, table_metrics


def rec(rid: str, kind: str, first_us: int, first_output_us: int | None) -> RequestRecord:
    return RequestRecord(
        request_id=rid, session_id=rid, session_index=0, turn_index=0, turn_class="first", tenant="t",
        target="x", worker="w", status="ok", t_sched_us=0, t_send_us=0, t_first_us=first_us,
        t_last_us=first_us + 50, t_end_us=first_us + 60, output_tokens=4, chunks=4, itl_us=[10, 20, 20],
        step_id="p", step_kind=kind, session_steps=1, t_first_output_us=first_output_us, reasoning_tokens=2,
    )  # fmt: skip


def test_step_kind_histograms_carry_ttfot_from_the_records() -> None:
    kinds = step_kind_stats([rec("a", "first", 100, 400), rec("b", "join", 100, None)])
    first, join = kinds["first"].histograms["ttfot"], kinds["join"].histograms["ttfot"]
    assert first.get_total_count() == 1 and first.get_max_value() == 400
    assert join.get_total_count() == 0  # a record without a first answer token records none


def dist(p50: float, p99: float, count: int = 3) -> dict:
    return {"count": count, "p50": p50, "p99": p99}


def group(ttfot: dict | None) -> dict:
    m = {"ttft": dist(10, 20), "tpot": dist(1, 2), "itl": dist(1, 3), "e2e": dist(50, 90)}
    if ttfot is not None:
        m["ttfot"] = ttfot
    return {
        "metrics": m, "requests": {"measured": 3}, "errors": {"total": 0},
        "throughput": {"output_tokens_per_s": 12.0}, "slo": {"attainment": 1.0},
    }  # fmt: skip


def test_group_table_shows_ttfot_beside_ttft_where_a_group_has_it() -> None:
    header, row_a, row_b = _group_table(
        "turn class", {"first": group(dist(33, 44)), "follow-up": group(None)}
    )
    assert header.index("ttft p99") < header.index("ttfot p50") < header.index("tpot p50")
    assert row_a.split()[6:8] == ["33.0", "44.0"] and row_b.split()[6:8] == ["-", "-"]
    plain = _group_table("turn class", {"first": group(None)})[0]
    assert "ttfot" not in plain


def test_step_kind_table_shows_ttfot() -> None:
    kinds = {
        k: {"requests": 2, "errors": 0, "metrics": group(dist(5, 7))["metrics"]}
        for k in ("first", "fan-out child")
    }
    lines = _dag_lines({"by_step_kind": kinds})
    header, first = lines[1], lines[2]
    assert header.index("ttft p99") < header.index("ttfot p50") < header.index("itl p50")
    assert first.split()[5:7] == ["5.00", "7.00"]


def test_ab_table_adds_ttfot_rows_when_an_arm_has_them() -> None:
    def summary(ttfot_mean: float | None) -> dict:
        metrics = {"ttft": {"mean": 10.0, "p50": 10.0, "p95": 10.0, "p99": 10.0}}
        if ttfot_mean is not None:
            metrics["ttfot"] = {"count": 4, **dict.fromkeys(("mean", "p50", "p95", "p99"), ttfot_mean)}
        return {"metrics": metrics, "by_turn_class": {}}

    sums = [summary(40.0), summary(20.0)]
    assert table_metrics(sums) == ("ttft", "ttfot")
    assert table_metrics([summary(None), summary(None)]) == ("ttft",)
    table = side_by_side(["a", "b"], sums, table_metrics(sums)).splitlines()
    row = next(line for line in table if line.split()[:3] == ["ttfot", "all", "mean"])
    assert row.split()[-3:] == ["40.0ms", "20.0ms", "0.50x"]
