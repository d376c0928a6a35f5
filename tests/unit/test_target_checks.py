"""Cold start and quality in the reports: the terminal table of a measurement, the summary lines
and the HTML tables, from run.json-shaped data."""

from __future__ import annotations

from analysis.target_checks import target_checks_html, target_checks_lines
from targets.fleet.coldstart import ColdStart, format_cold_starts


def test_format_cold_starts_gives_p50_and_max_per_process_and_phase():
    rounds = [
        [ColdStart("router", "router", listening_s=1.0, healthy_s=1.2, first_token_s=1.3),
         ColdStart("sim-0", "replica", listening_s=0.5, healthy_s=0.6, first_token_s=0.7)],
        [ColdStart("router", "router", listening_s=2.0, healthy_s=2.2, first_token_s=2.3),
         ColdStart("sim-0", "replica", listening_s=0.4, healthy_s=None, first_token_s=None, error="exited before healthy")],
        [ColdStart("router", "router", listening_s=3.0, healthy_s=3.2, first_token_s=3.3),
         ColdStart("sim-0", "replica", listening_s=0.6, healthy_s=0.8, first_token_s=0.9)],
    ]  # fmt: skip
    lines = format_cold_starts(rounds).splitlines()
    assert lines[0].startswith("cold start over 3 launches")
    router = lines[2].split()
    assert router[0] == "router" and router[1:4] == ["2.000", "/", "3.000"] and router[-3:] == ["2.300", "/", "3.300"]
    sim = lines[3].split()
    # p50 over the launches that reached the phase; the failed one is a note, not a zero.
    assert sim[1:4] == ["0.500", "/", "0.600"] and sim[4:7] == ["0.700", "/", "0.800"]
    assert lines[4] == "note: sim-0: exited before healthy"


def test_as_dict_keeps_unreached_phases_as_null():
    d = ColdStart("sim-0", "replica", url="http://127.0.0.1:1", listening_s=0.5).as_dict()
    assert d == {"name": "sim-0", "role": "replica", "url": "http://127.0.0.1:1", "listening_s": 0.5,
                 "healthy_s": None, "first_token_s": None}  # fmt: skip


SUMMARY = {
    "targets": [
        {
            "label": "sglang-round_robin",
            "cold_start": [
                {"name": "sglang-router", "role": "router", "listening_s": 1.5, "healthy_s": 1.6, "first_token_s": 1.61},
                {"name": "sim-0", "role": "replica", "listening_s": 0.7, "healthy_s": 0.71, "first_token_s": 0.72},
            ],
            "quality": {
                "eval": "default", "score": 0.5, "correct": 1, "total": 2, "min_score": 0.9, "passed": False,
                "items": [
                    {"id": "a", "prompt": "Q <1>?", "expected": "A", "answer": "A", "correct": True},
                    {"id": "b", "prompt": "R?", "expected": "B", "answer": None, "correct": False, "error": "HTTP 500"},
                ],
            },
        },
        {"label": "external"},
    ]
}  # fmt: skip


def test_summary_lines_name_each_process_and_the_wrong_items():
    lines = target_checks_lines(SUMMARY)
    assert lines == [
        "cold start  sglang-round_robin: router sglang-router: listening 1.500 s, healthy 1.600 s, first token 1.610 s after launch",
        "cold start  sglang-round_robin: replica sim-0: listening 0.700 s, healthy 0.710 s, first token 0.720 s after launch",
        "quality     sglang-round_robin: 1/2 correct, score 0.500 (gate 0.9: FAIL; eval default); wrong: b",
    ]
    assert target_checks_lines({"targets": [{"label": "external"}]}) == []


def test_html_tables_escape_and_show_every_item():
    html = target_checks_html(SUMMARY)
    assert "<h3>Cold start" in html and html.count("<tr>") == 3 + 3  # header + 2 processes, header + 2 items
    assert "Q &lt;1&gt;?" in html and "(no answer: HTTP 500)" in html and ">FAIL<" in html
    assert target_checks_html({"targets": [{"label": "external"}]}) == ""
