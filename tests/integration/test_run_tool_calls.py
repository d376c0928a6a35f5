"""Tool-call replies against the sim's truth, on chat, Messages and Responses.

The sim (``--tool-calls``) answers about half of the requests that offer tools with a call whose
arguments are the reply's tokens, after its reasoning. The client must count those tokens as
output (the sim's ``completion_tokens``), time TTFOT at the first argument chunk (the sim's first
answer write, ``ttfot_excess_ms`` of test_run_reasoning.py), and the session's next turn, built
on that reply, must be a body the sim accepts (every request ok, follow-ups after tool calls).
"""

from __future__ import annotations

import urllib.request
from collections import defaultdict

import orjson
import pytest

from loadgen.engine.client import SessionConnection
from targets.adapters.base import ChatRequest
from targets.registry import get_adapter

from .runs import loadgen, percentile, records, run_dir, sim, truth
from .test_run_reasoning import ttfot_excess_ms

ADAPTERS = ["openai-chat", "anthropic-messages", "openai-responses"]
REASONING = 2
# A plan, then tool steps answered by apply_patch results: every request offers that tool.
SPEC = """\
name: tiny-tools
system_prompt_tokens: 20
first_user_tokens: 20
user_tokens: {dist: uniform, low: 10, high: 30}
tool_output_tokens: {dist: uniform, low: 10, high: 30}
output_tokens: 12
think_time: {dist: uniform, low: 10ms, high: 30ms}
tool_time: 10ms
steps:
  - {id: plan, kind: request}
  - {id: edit, kind: tool, tool: apply_patch, repeat: {dist: uniform, low: 2, high: 3}}
"""


# The Responses run keeps its history on the server: a follow-up must answer the calls the
# server's stored reply made (the sim, like the service, refuses one that does not).
ADAPTER_OPTIONS = {"openai-responses": "server_history=true"}


@pytest.mark.slow
@pytest.mark.parametrize("adapter", ADAPTERS)
def test_tool_call_replies_match_the_sims_truth(tmp_path, adapter, capsys) -> None:
    spec = tmp_path / "tiny-tools.yaml"
    spec.write_text(SPEC)
    results = tmp_path / "results"
    args = ("--profile", "tiny", "--time-scale", "10", "--seed", "5", "--reasoning-tokens", str(REASONING),
            "--tool-calls", '{"fraction": 0.5}')  # fmt: skip
    with sim(tmp_path, *args) as (proc, truth_log):
        r = loadgen(
            "run", "--target", proc.url, "--adapter", adapter, "--workload", str(spec), "--rate", "10",
            "--num-sessions", "6", "--seed", "5", "--max-schedule-lag", "10s", "--results", str(results),
            *(("--adapter-options", ADAPTER_OPTIONS[adapter]) if adapter in ADAPTER_OPTIONS else ()),
        )  # fmt: skip
        assert r.returncode == 0, r.stderr[-3000:]
    recs = records(run_dir(results))
    t = truth(truth_log)
    assert len(recs) >= 18 and all(rec.ok for rec in recs), [(rec.status, rec.error_message) for rec in recs if not rec.ok]
    calls = [rec for rec in recs if t[rec.request_id]["tool_call"] is not None]
    assert 0 < len(calls) < len(recs)  # about half: a draw per prompt
    assert {t[rec.request_id]["tool_call"] for rec in calls} == {"apply_patch"}
    # A tool-call reply goes back into the history and its session goes on: the next turn was accepted.
    turns = defaultdict(dict)
    for rec in recs:
        turns[rec.session_id][rec.turn_index] = rec
    followed = [rec for rec in calls if rec.turn_index + 1 in turns[rec.session_id]]
    assert followed, "no turn followed a tool-call reply"

    ttfot_err_ms, excess_ms = [], []
    for rec in recs:
        tr = t[rec.request_id]
        assert rec.output_tokens == tr["completion_tokens"] == rec.max_tokens, rec.request_id
        assert rec.reasoning_tokens == tr["reasoning_tokens"] == min(REASONING, rec.max_tokens - 1)
        ttfot_err_ms.append(abs(rec.ttfot_us - (tr["t_first_output_ns"] - tr["t_received_ns"]) / 1000) / 1000)
        excess_ms.append(ttfot_excess_ms(rec, tr))
    with capsys.disabled():
        print(
            f"\n[tool calls {adapter}] {len(calls)} of {len(recs)} replies were calls: |TTFOT err| p50 "
            f"{percentile(ttfot_err_ms, 50):.3f} ms max {max(ttfot_err_ms):.3f} ms"
        )
    # test_run_reasoning.py's and test_agent_apis.py's margins
    assert percentile(ttfot_err_ms, 50) <= 5.0 and max(ttfot_err_ms) <= 50.0, ttfot_err_ms
    timed = [x for x in excess_ms if x is not None]
    assert len(timed) >= 3 * len(excess_ms) // 4, excess_ms
    assert max(abs(x) for x in timed) <= 2.0, timed


TOOLS = [{"type": "function", "function": {"name": "run_tests", "description": "Run the tests.", "parameters": {}}}]


def test_streamed_and_whole_tool_calls_through_the_client(tmp_path) -> None:
    messages = [{"role": "user", "content": "run the tests please"}]
    spec = ("--profile", "tiny", "--time-scale", "0", "--reasoning-tokens", "2", "--tool-calls", '{"fraction": 1}')
    results = {}
    with sim(tmp_path, *spec) as (proc, truth_log), SessionConnection(proc.url) as conn:
        for name in ADAPTERS:
            adapter = get_adapter(name)
            for stream in (True, False):
                rid = f"{name}-{stream}"
                req = ChatRequest(messages=messages, max_tokens=7, session_id="s", request_id=rid, stream=stream,
                                  extra_body={"tools": TOOLS})  # fmt: skip
                results[rid] = conn.stream(adapter.build_request(req), adapter, deadline_s=20)
        with urllib.request.urlopen(proc.url + "/sim/info", timeout=5) as resp:
            info = orjson.loads(resp.read())
    assert info["behaviour"]["tool_calls"] == {"fraction": 1.0, "tool": None}
    t = truth(truth_log)
    for rid, res in results.items():
        assert res.ok, (rid, res.error_message)
        # 2 reasoning tokens, 5 argument tokens: output, not reply text; reasoning counted whole too
        assert (res.output_tokens, res.reasoning_tokens, res.text) == (7, 2, ""), rid
        assert t[rid]["tool_call"] == "run_tests" and t[rid]["completion_tokens"] == 7
