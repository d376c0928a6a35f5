"""The TTFT split (server prefill vs the rest) against numbers worked out by hand.

Six requests; prefill is ``server_timings.prompt_ms`` (llama-server), the rest is TTFT - prefill:

=====  ==========  ====  =======  =====  ========  =======
req    class       TTFT  prefill  rest   prompt_n  cache_n
=====  ==========  ====  =======  =====  ========  =======
r0-0   first        500      400    100       300       20
r0-1   follow-up    120       30     90        40      330
r1-0   first        700      420    280       310       20
r1-1   follow-up     90      100  -10→0        50      340   (TTFT below prefill: counted)
r1-2   follow-up    200        -      -         -        -   (no server timings: left out)
r2-0   first      error        -      -         -        -   (failed: left out)
=====  ==========  ====  =======  =====  ========  =======
"""

from __future__ import annotations

import csv
import io

import pytest

from analysis.records import RequestRecord
from analysis.report import render_report
from analysis.summary import summarize
from analysis.summary_format import format_summary, summary_to_csv
from analysis.ttft_split import prefill_us, ttft_split
from tests.fixtures.results.synth import record, write_run

approx = lambda v: pytest.approx(v, rel=1e-3)  # noqa: E731  hdrh keeps 3 significant digits


def timings(prompt_ms: float, prompt_n: int, cache_n: int) -> dict:
    return {"prompt_ms": prompt_ms, "prompt_n": prompt_n, "cache_n": cache_n, "predicted_ms": 50.0}


def records() -> list[RequestRecord]:
    rows = [
        (0, 0, 0, 500, timings(400.0, 300, 20)),
        (0, 1, 1000, 120, timings(30.0, 40, 330)),
        (1, 0, 200, 700, timings(420.0, 310, 20)),
        (1, 1, 1500, 90, timings(100.0, 50, 340)),
        (1, 2, 2500, 200, None),
    ]
    out = []
    for session, turn, sched_ms, ttft_ms, t in rows:
        r = record(session, turn, sched_ms=sched_ms, ttft_ms=ttft_ms, itl_ms=[10.0])
        r.server_timings = t
        out.append(r)
    out.append(record(2, 0, sched_ms=300, error="connection"))
    return out


@pytest.fixture(scope="module")
def summary(tmp_path_factory):
    d = write_run(tmp_path_factory.mktemp("split"), records())
    return summarize(d)


def test_prefill_is_prompt_ms_in_microseconds():
    r = record(0, 0, sched_ms=0, ttft_ms=10)
    assert prefill_us(r) is None
    for bad in ({}, {"prompt_ms": None}, {"prompt_ms": "12"}, {"prompt_ms": True}, {"prompt_ms": -1.0}):
        r.server_timings = bad
        assert prefill_us(r) is None, bad
    r.server_timings = {"prompt_ms": 111.1374}
    assert prefill_us(r) == 111_137


def test_overall_split(summary):
    s = summary["ttft_split"]
    assert s["source"] == "server_timings.prompt_ms"
    assert (s["requests"], s["requests_with_ttft"], s["ttft_below_prefill"]) == (4, 5, 1)
    pre, rest, ttft = s["prefill_ms"], s["client_minus_prefill_ms"], s["ttft_ms"]
    assert (pre["count"], rest["count"], ttft["count"]) == (4, 4, 4)
    assert pre["min"] == approx(30) and pre["max"] == approx(420) and pre["p50"] == approx(100)
    assert pre["mean"] == approx((400 + 30 + 420 + 100) / 4)
    assert rest["max"] == approx(280) and rest["p50"] == approx(90)
    assert rest["min"] == 0.001  # the negative rest, recorded at the histogram's floor (1 µs)
    assert ttft["p50"] == approx(120) and ttft["max"] == approx(700)
    assert s["prefill_share"] == round(950 / 1410, 4)
    assert (s["prompt_tokens_evaluated"], s["prompt_tokens_cached"]) == (700, 710)
    assert s["cached_share"] == round(710 / 1410, 4)


def test_split_by_turn_class(summary):
    by = summary["ttft_split"]["by_turn_class"]
    assert list(by) == ["first", "follow-up"]
    first, follow = by["first"], by["follow-up"]
    assert (first["requests"], first["requests_with_ttft"], first["ttft_below_prefill"]) == (2, 2, 0)
    assert first["prefill_ms"]["p50"] == approx(400) and first["prefill_ms"]["p99"] == approx(420)
    assert first["client_minus_prefill_ms"]["p50"] == approx(100)
    assert first["client_minus_prefill_ms"]["p99"] == approx(280)
    assert first["cached_share"] == round(40 / 650, 4)
    assert first["prefill_share"] == round(820 / 1200, 4)
    assert (follow["requests"], follow["requests_with_ttft"], follow["ttft_below_prefill"]) == (2, 3, 1)
    assert follow["prefill_ms"]["p50"] == approx(30) and follow["prefill_ms"]["p99"] == approx(100)
    assert follow["client_minus_prefill_ms"]["p99"] == approx(90)
    assert follow["cached_share"] == round(670 / 760, 4)
    # ttft - prefill over 120 + 90 ms of TTFT: 90 + 0 (the negative one counts as 0)
    assert follow["prefill_share"] == round(130 / 210, 4)


def test_no_timings_no_split(tmp_path):
    plain = [record(0, 0, sched_ms=0, ttft_ms=100), record(0, 1, sched_ms=500, ttft_ms=50)]
    assert ttft_split(plain) is None
    s = summarize(write_run(tmp_path, plain))
    assert s["ttft_split"] is None
    assert "ttft split" not in format_summary(s)
    assert "No server timings" in render_report(tmp_path)


def test_timings_without_token_counts():
    r = record(0, 0, sched_ms=0, ttft_ms=100)
    r.server_timings = {"prompt_ms": 60.0}
    s = ttft_split([r])
    assert s["requests"] == 1 and s["client_minus_prefill_ms"]["p50"] == approx(40)
    assert s["prompt_tokens_cached"] is None and s["cached_share"] is None


def test_terminal_table(summary):
    text = format_summary(summary)
    lines = text.splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.startswith("ttft split"))
    assert lines[i].split() == [
        "ttft", "split", "reqs", "ttft", "p50", "prefill", "p50", "prefill", "p99", "rest", "p50",
        "rest", "p99", "prefill", "cached",
    ]  # fmt: skip
    first = lines[i + 2].split()
    assert first[0] == "first" and first[1] == "2" and first[-2:] == ["68.3%", "6.2%"]
    assert lines[i + 3].split()[0] == "follow-up"
    assert "4 of 5 requests with server timings" in text
    assert "1 request(s) had a TTFT below their server prefill time" in text


def test_csv_rows(summary):
    rows = [r for r in csv.reader(io.StringIO(summary_to_csv(summary))) if r[0] == "ttft_split"]
    by = {(g, m, stat): v for _, g, m, stat, v, _unit in rows}
    assert float(by[("first", "prefill", "p50")]) == approx(400)
    assert float(by[("follow-up", "client_minus_prefill", "p99")]) == approx(90)
    assert by[("", "prompt_tokens_cached", "total")] == "710"
    assert by[("", "cached_share", "value")] == str(round(710 / 1410, 4))


def test_html_section(tmp_path):
    d = write_run(tmp_path, records())
    html = render_report(d)
    start = html.index('<section id="ttft-split">')
    block = html[start : html.index("</section>", start)]
    assert "4 of 5 successful requests carry server timings" in block
    assert "<td>first</td><td>2</td>" in block and "<td>follow-up</td><td>2</td>" in block
    assert "1 request(s) had a TTFT below their server prefill time" in block
