"""Reasoning-aware metrics: TTFOT and the answer's TPOT by the recording rule, reasoning tokens
from usage or the chunks, the client's stamp of the first answer chunk, SLOs on TTFOT, and the
sim's reasoning stream as the adapter reads it."""

from __future__ import annotations

from collections import Counter

import orjson
import pytest

from analysis.records import METRICS, RequestRecord, metric_values
from analysis.results import histograms_from_records
from analysis.slo import parse_slos
from loadgen.engine import client, sse_state
from loadgen.engine.recorder import metric_sums
from targets.adapters.base import Usage
from targets.adapters.openai import OpenAIChatAdapter
from targets.sim.wire import CHAT, WORD_BYTES, StreamTemplate, full_response


def rec(**kw) -> RequestRecord:
    base = dict(
        request_id="r", session_id="s", session_index=0, turn_index=0, turn_class="first", tenant="t",
        target="x", worker="w", status="ok", t_sched_us=0, t_send_us=100, t_first_us=1_100,
        t_last_us=10_100, t_end_us=10_200, output_tokens=10, chunks=10, itl_us=[1_000] * 9,
    )  # fmt: skip
    base.update(kw)
    return RequestRecord(**base)


def test_ttfot_and_answer_tpot_follow_the_reasoning():
    r = rec(t_first_output_us=5_100, reasoning_tokens=4)  # 4 reasoning tokens, then 6 of answer
    assert r.ttft_us == 1_000 and r.ttfot_us == 5_000
    assert r.tpot_us == pytest.approx(9_000 / 9)
    assert r.output_only_tokens == 6 and r.tpot_output_us == pytest.approx(5_000 / 5)
    values = dict(metric_values(r))
    assert values["ttfot"] == 5_000 and values["tpot_output"] == 1_000 and values["ttft"] == 1_000
    assert {"ttfot", "tpot_output"} <= set(METRICS)


def test_without_reasoning_ttfot_is_ttft_and_the_tpots_agree():
    r = rec(t_first_output_us=1_100, reasoning_tokens=0)
    values = dict(metric_values(r))
    assert values["ttfot"] == values["ttft"] and values["tpot_output"] == values["tpot"]


def test_older_records_and_reasoning_only_replies_have_no_ttfot():
    old = RequestRecord.from_dict({k: v for k, v in rec().to_dict().items() if k not in ("t_first_output_us", "reasoning_tokens")})
    assert old.t_first_output_us is None and old.reasoning_tokens is None and old.ttfot_us is None
    assert not {"ttfot", "tpot_output"} & {m for m, _ in metric_values(old)}
    only = rec(t_first_output_us=None, reasoning_tokens=10)
    assert only.ttfot_us is None and only.tpot_output_us is None
    one = rec(t_first_output_us=10_100, reasoning_tokens=9)  # a one-token answer: no answer TPOT
    assert one.tpot_output_us is None and dict(metric_values(one))["ttfot"] == 10_000


def test_bulk_rebuild_and_live_sums_use_the_same_rule():
    recs = [
        rec(request_id="a", t_first_output_us=5_100, reasoning_tokens=4),
        rec(request_id="b", t_first_output_us=1_100, reasoning_tokens=0),
        rec(request_id="c"),
        rec(request_id="d", t_first_output_us=None, reasoning_tokens=10),
    ]
    counts: Counter = Counter()
    sums: Counter = Counter()
    for r in recs:
        for m, v in metric_values(r):
            counts[m] += 1
            sums[m] += v
        live = dict(metric_sums(r))
        for m in ("ttfot", "tpot_output"):
            assert live.get(m) == (sum(v for k, v in metric_values(r) if k == m) or None)
    hists = histograms_from_records(recs)
    for m in ("ttfot", "tpot_output"):
        h = hists[f"{m}:first:t:x"]
        assert h.get_total_count() == counts[m] == 2


def test_slos_on_ttfot_parse_and_judge():
    slos = parse_slos("ttfot_p99=2s,tpot_output_mean=40ms,ttfot=3ms")
    assert [(s.metric, s.percentile) for s in slos.percentile] == [("ttfot", 99.0), ("tpot_output", None)]
    (per,) = slos.per_request
    assert per.metric == "ttfot"
    assert per.met_by(rec(t_first_output_us=2_100)) and not per.met_by(rec(t_first_output_us=5_100))
    assert not per.met_by(rec(t_first_output_us=None))  # a reply of reasoning only misses it


def _state():
    res = client.StreamResult()
    return sse_state.StreamState(OpenAIChatAdapter().new_stream().parse_line, res), res


def _sim_stream(reasoning: int, n: int) -> list[bytes]:
    tpl = StreamTemplate(CHAT, "chatcmpl-x", 0, "m")
    out = [tpl.role()]
    out += [tpl.reasoning_chunk if i < reasoning else tpl.token(i) for i in range(n)]
    out += [tpl.finish(), tpl.usage(5, n, 0, reasoning)]
    return b"".join(out).split(b"\n")


def test_the_client_stamps_the_first_answer_chunk_and_counts_reasoning():
    st, res = _state()
    lines = _sim_stream(3, 6)
    for i, line in enumerate(lines):  # one line per receive: each its own stamp
        st.take([line], 1_000 + i)
    assert st.reasoning == 3
    first_answer = next(i for i, line in enumerate(lines) if b'"content":" ' in line)
    assert st.output_ns == 1_000 + first_answer and st.output_ns > st.chunk_ns[0]
    assert "".join(st.parts) == "".join(WORD_BYTES[i].decode() for i in range(3, 6))  # the answer only
    res.usage = st.usage
    res.chunk_tokens.extend(st.chunk_tokens)
    res.reasoning_chunk_tokens = st.reasoning
    assert st.usage.reasoning_tokens == 3 and res.reasoning_tokens == 3


def test_the_slow_path_applies_the_same_rule():
    st, _ = _state()
    adapter = OpenAIChatAdapter()
    parse = adapter.new_stream().parse_line
    for i, line in enumerate(_sim_stream(2, 4)):
        ev = parse(line) if line else None
        if ev is not None:
            st._apply(ev, 10 + i)
    assert st.reasoning == 2 and st.output_ns is not None and st.output_ns > st.chunk_ns[0]


def test_reasoning_tokens_prefer_usage_when_it_is_at_least_the_chunks():
    r = client.StreamResult(chunk_tokens=[1] * 6, usage=Usage(5, 6, None, 4), reasoning_chunk_tokens=2)
    assert r.reasoning_tokens == 4
    r = client.StreamResult(chunk_tokens=[1] * 6, usage=Usage(5, 6, None, 1), reasoning_chunk_tokens=2)
    assert r.reasoning_tokens == 2  # usage below what the chunks carried: the chunks
    r = client.StreamResult(chunk_tokens=[1] * 6, usage=Usage(5, 6, None, None), reasoning_chunk_tokens=3)
    assert r.reasoning_tokens == 3


def test_the_sims_non_streaming_reply_keeps_reasoning_out_of_the_text():
    body = full_response(CHAT, "c", 0, "m", " a b", 5, 5, 0, 3)
    obj = orjson.loads(body)
    assert obj["usage"]["completion_tokens_details"] == {"reasoning_tokens": 3}
    ev = OpenAIChatAdapter().parse_response(body)
    assert ev.text == " a b" and ev.usage.reasoning_tokens == 3


def test_compare_and_gate_take_ttfot_when_runs_have_it(tmp_path):
    from analysis.compare import compare_runs, find_row
    from analysis.gate import gate
    from tests.fixtures.results.synth import record, write_run

    def run(name: str, extra_ms: float):
        recs = []
        for s in range(40):
            for t in range(2):
                r = record(s, t, sched_ms=500 + s * 100 + t * 1500, ttft_ms=50, itl_ms=[10] * 8)
                r.t_first_output_us = r.t_first_us + round(extra_ms * 1000)
                r.reasoning_tokens = 3
                recs.append(r)
        return write_run(tmp_path / name, recs)

    a, b = run("a", 100), run("b", 300)
    cmp = compare_runs(a, b, n_boot=200)
    row = find_row(cmp, "ttfot", "all", "p50")
    assert row is not None and row["b"] > row["a"] and find_row(cmp, "tpot_output", "all", "p50") is not None
    result = gate(b, a, {"ttfot_p50": "10%"}, "ttfot_p99=1s", n_boot=200)
    assert not result.ok and any("ttfot" in line.lower() for line in result.reasons), result.checks
    assert any("ttfot_p99" in line for line in result.checks), result.checks
