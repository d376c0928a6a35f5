"""A sweep tells the server's limit from the generator's, and leaves incomplete points unjudged.

Synthetic points (no runs): the server of ``tests.unit.test_analysis_sweep.model`` holds
``ttft_p99=450ms`` up to 38.9/s; here the generator falls behind above 30/s.
"""

from __future__ import annotations

from analysis.report import render_sweep_report
from analysis.slo import parse_slos
from analysis.sweep import describe_max, find_max_rate, format_sweep, grid
from tests.unit.test_analysis_sweep import SLOS, model

GENERATOR_LIMIT = 30.0


def saturating(rate: float) -> dict:
    """The model's server, measured by a generator that cannot keep its schedule above 30/s."""
    s = model(rate)
    saturated = rate > GENERATOR_LIMIT
    s["generator"] = {"saturated": saturated, "schedule_lag_p99_ms": 35.0 if saturated else 1.0,
                      "saturated_by": ["schedule-lag p99 35.0 ms"] if saturated else []}  # fmt: skip
    s["generator_saturated"] = saturated
    return s


def test_a_generator_limited_search_is_inconclusive_above_the_last_rate_that_held():
    res = find_max_rate(saturating, SLOS, 1.0, 64.0, tolerance=0.5)
    assert 29.5 <= res.max_rate_per_s <= GENERATOR_LIMIT
    assert res.limited_by == "generator"
    # the points above 30/s met the SLOs: they are the generator's, not misses of the server's
    above = [p for p in res.points if p.rate_per_s > GENERATOR_LIMIT]
    assert above and all(p.outcome == "generator" and not p.ok for p in above)
    assert not any(p.outcome == "slo" for p in res.points)
    line = describe_max(res)
    best = f"{res.max_rate_per_s:g}/s"
    assert f"inconclusive above {best}: the generator was the limit (add workers)" in line, line
    assert not line.startswith(f"max rate holding the SLOs: {best};"), line  # not named as the server's limit
    assert not any("the limit lies in" in n for n in res.notes), res.notes
    assert res.exit_code == 4
    d = res.to_dict()
    assert d["limited_by"] == "generator" and d["server_limit_per_s"] is None
    assert {p["outcome"] for p in d["points"]} == {"holds", "generator"}
    assert "inconclusive above" in format_sweep(res)
    html = render_sweep_report(res)
    assert f"max rate at least {best[:-2]} sessions/s, inconclusive above" in html and ">generator<" in html


def test_a_server_miss_below_the_generators_limit_names_the_servers_limit():
    def slow_server(rate: float) -> dict:  # the server's limit, 19.4/s, is under the generator's 30/s
        return {
            **saturating(rate),
            "metrics": model(rate * 2)["metrics"],
            "errors": model(rate * 2)["errors"],
        }

    res = find_max_rate(slow_server, SLOS, 1.0, 64.0, tolerance=0.5)
    assert res.limited_by == "slo" and res.exit_code == 0
    assert 19.0 <= res.max_rate_per_s <= 19.45
    assert describe_max(res).startswith(f"max rate holding the SLOs: {res.max_rate_per_s:g}/s; there ")
    assert res.server_limit_per_s is not None and res.server_limit_per_s > res.max_rate_per_s


def test_a_generator_limited_point_that_missed_an_slo_is_not_the_servers_miss():
    def worse(rate: float) -> dict:
        s = saturating(rate)
        if rate > GENERATOR_LIMIT:  # the client's own delay shows up as latency
            s["metrics"]["ttft"]["p99"] = 5000.0
        return s

    res = grid(worse, SLOS, [10, 20, 35])
    assert [p.outcome for p in res.points] == ["holds", "holds", "generator"]
    assert res.max_rate_per_s == 20 and res.limited_by == "generator" and res.exit_code == 4
    assert "inconclusive above 20/s: the generator was the limit (add workers)" in describe_max(res)


def test_exit_4_of_a_point_is_the_generators_and_exit_5_is_incomplete():
    from analysis.sweep import judge_point

    slos = parse_slos(SLOS)
    assert judge_point({**model(10), "exit_code": 4}, slos)[0] == "generator"
    assert judge_point({**model(10), "exit_code": 5}, slos)[0] == "incomplete"
    aborted = {
        **model(10),
        "status": "aborted",
        "partial": True,
        "partial_reason": "the run was aborted: stop",
    }
    outcome, reasons = judge_point(aborted, slos)
    assert outcome == "incomplete" and "neither pass nor fail" in reasons[0]
    assert judge_point(model(10), slos) == ("holds", [])
    assert judge_point(model(45), slos)[0] == "slo"


def test_an_incomplete_point_is_neither_pass_nor_fail():
    def flaky(rate: float) -> dict:  # runs above 30/s end early (or invalid: exit 5)
        s = model(rate)
        if 30 < rate < 40:
            s.update(status="aborted", partial=True, partial_reason="the run was aborted: worker lost")
        elif rate >= 40:
            s["exit_code"] = 5
        return s

    res = find_max_rate(flaky, SLOS, 1.0, 64.0, tolerance=0.5)
    assert {p.outcome for p in res.points if p.rate_per_s > 30} == {"incomplete"}
    assert not any(p.outcome == "slo" for p in res.points)  # 64/s missed, but its run is not valid
    assert 29.5 <= res.max_rate_per_s <= 30 and res.limited_by == "incomplete" and res.exit_code == 5
    line = describe_max(res)
    assert f"inconclusive above {res.max_rate_per_s:g}/s" in line and "(neither pass nor fail)" in line, line
    assert any(
        n.startswith("the runs at ") and n.endswith("were incomplete: neither pass nor fail")
        for n in res.notes
    )
    g = grid(flaky, SLOS, [10, 35, 38])
    assert [p.outcome for p in g.points] == ["holds", "incomplete", "incomplete"]
    assert g.max_rate_per_s == 10 and g.exit_code == 5


def test_nothing_held_says_whose_fault():
    assert grid(model, SLOS, [45, 60]).exit_code == 3
    gen = grid(saturating, SLOS, [35, 40])
    assert gen.max_rate_per_s is None and gen.exit_code == 4
    assert "the generator could not keep up" in describe_max(gen)
