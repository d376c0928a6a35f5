"""`loadgen run` through the Anthropic Messages and OpenAI Responses APIs, against the sim.

What the client measured is checked against the sim's truth log: every request ok, output tokens
(from each API's usage) equal to the tokens the sim wrote, prompt and cached tokens equal to the
sim's, and TTFT no shorter than the sim's own (handler start to first token write) and within a few
milliseconds of it; with reasoning on, the reasoning tokens and TTFOT match the sim's as on chat.
The same conversation, tool calls included, is the same prompt on every API.
"""

from __future__ import annotations

import orjson
import pytest

from loadgen.engine.client import SessionConnection
from targets.adapters.anthropic import AnthropicMessagesAdapter
from targets.adapters.base import ChatRequest
from targets.adapters.openai import OpenAIChatAdapter
from targets.adapters.responses import OpenAIResponsesAdapter
from targets.registry import get_adapter
from targets.sim.api import parse_request
from targets.sim.process import SimProcess
from targets.sim.wire import CHAT
from targets.sim.wire_events import MESSAGES, RESPONSES

from .runs import loadgen, percentile, records, run_dir, sim, truth
from .test_run_reasoning import ttfot_excess_ms

ADAPTERS = [("anthropic-messages", MESSAGES), ("openai-responses", RESPONSES)]
REASONING = 3


@pytest.mark.parametrize(("adapter", "endpoint"), ADAPTERS)
def test_run_matches_the_sims_truth(tmp_path, adapter, endpoint) -> None:
    results = tmp_path / "results"
    spec = ("--profile", "tiny", "--time-scale", "10", "--seed", "4", "--reasoning-tokens", str(REASONING))
    with sim(tmp_path, *spec) as (proc, truth_log):
        r = loadgen(
            "run", "--target", proc.url, "--adapter", adapter, "--workload", "tiny",
            "--num-sessions", "4", "--rate", "20", "--seed", "4", "--max-schedule-lag", "10s", "--results", str(results),
        )  # fmt: skip
        assert r.returncode == 0, r.stderr[-3000:]
    recs = records(run_dir(results))
    t = truth(truth_log)
    assert len(recs) >= 4 and all(rec.ok for rec in recs), [rec.status for rec in recs]
    assert any(rec.cached_tokens for rec in recs)  # follow-up turns hit the prefix cache
    ttft_err_ms, ttfot_err_ms, excess_ms = [], [], []
    for rec in recs:
        tr = t[rec.request_id]
        assert tr["endpoint"] == endpoint and tr["stream"] and tr["outcome"] == "ok"
        assert rec.output_tokens == tr["completion_tokens"] == rec.max_tokens
        assert rec.chunk_output_tokens in (None, rec.output_tokens)
        assert rec.prompt_tokens == tr["prompt_tokens"] and rec.cached_tokens == tr["cached_tokens"]
        sim_ttft_us = (tr["t_first_token_ns"] - tr["t_received_ns"]) / 1000
        assert rec.ttft_us >= sim_ttft_us
        ttft_err_ms.append((rec.ttft_us - sim_ttft_us) / 1000)
        # Reasoning (thinking blocks, reasoning items) before the answer, as on chat: the same
        # count, and TTFOT at the sim's first answer write: TTFOT - TTFT within
        # test_run_reasoning.py's 2 ms of the sim's, TTFOT itself within this test's TTFT margins.
        assert rec.reasoning_tokens == tr["reasoning_tokens"] == min(REASONING, rec.max_tokens - 1), rec.request_id
        assert tr["prompt_reasoning_words"] == 0  # reasoning never went back into the history
        ttfot_err_ms.append(abs(rec.ttfot_us - (tr["t_first_output_ns"] - tr["t_received_ns"]) / 1000) / 1000)
        excess_ms.append(ttfot_excess_ms(rec, tr))  # test_run_reasoning.py's check of chat
    assert percentile(ttft_err_ms, 50) <= 5.0 and max(ttft_err_ms) <= 50.0, ttft_err_ms
    assert percentile(ttfot_err_ms, 50) <= 5.0 and max(ttfot_err_ms) <= 50.0, ttfot_err_ms
    timed = [x for x in excess_ms if x is not None]  # chunks not read coalesced: few in an exit-0 run
    assert len(timed) >= 3 * len(excess_ms) // 4, excess_ms
    assert max(abs(x) for x in timed) <= 2.0, timed


@pytest.mark.parametrize(("adapter", "endpoint"), ADAPTERS)
def test_run_against_the_embedded_sim(tmp_path, adapter, endpoint) -> None:
    results = tmp_path / "results"
    r = loadgen(
        "run", "--adapter", adapter, "--workload", "tiny", "--profile", "tiny", "--num-sessions", "4",
        "--max-schedule-lag", "10s", "--results", str(results),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    recs = records(run_dir(results))
    assert len(recs) >= 4 and all(rec.ok and rec.output_tokens == rec.max_tokens for rec in recs)


CONVERSATION = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Fix the failing test in parser dot py"},
    {
        "role": "assistant",
        "content": "Reading both files first",
        "tool_calls": [
            {"id": "call_r1", "type": "function", "function": {"name": "read_file", "arguments": '{"task":"r1"}'}},
            {"id": "call_r2", "type": "function", "function": {"name": "read_file", "arguments": '{"task":"r2"}'}},
        ],
    },
    {"role": "tool", "tool_call_id": "call_r1", "content": "def parse(x): return x"},
    {"role": "tool", "tool_call_id": "call_r2", "content": "assert parse(1) == 2"},
    {"role": "assistant", "content": "The parser returns its input unchanged"},
    {"role": "user", "content": "Then patch it"},
]
TOOLS = [
    {
        "type": "function",
        "function": {"name": "read_file", "description": "Run read_file and return its output.", "parameters": {}},
    }
]


def test_a_conversation_with_tool_calls_is_the_same_prompt_on_every_api() -> None:
    req = ChatRequest(
        messages=CONVERSATION, max_tokens=16, session_id="s", request_id="r", extra_body={"tools": TOOLS}
    )
    chat = parse_request(CHAT, orjson.loads(OpenAIChatAdapter().build_request(req).body), 64)
    for adapter, endpoint in ((AnthropicMessagesAdapter(), MESSAGES), (OpenAIResponsesAdapter(), RESPONSES)):
        got = parse_request(endpoint, orjson.loads(adapter.build_request(req).body), 64)
        assert got.prompt_ids == chat.prompt_ids, adapter.name
        assert (got.max_tokens, got.stream, got.include_usage) == (16, True, True)


def _one(url: str, adapter_name: str, *, stream: bool = True, max_tokens: int = 6):
    adapter = get_adapter(adapter_name)
    req = ChatRequest(messages=CONVERSATION, max_tokens=max_tokens, session_id="s", request_id="r-1", stream=stream)
    with SessionConnection(url) as conn:
        return conn.stream(adapter.build_request(req), adapter, deadline_s=20)


@pytest.mark.parametrize("adapter", [a for a, _ in ADAPTERS])
def test_streamed_and_whole_replies_through_the_client(adapter) -> None:
    proc = SimProcess.start(["--profile", "tiny", "--time-scale", "0"])
    try:
        streamed = _one(proc.url, adapter)
        whole = _one(proc.url, adapter, stream=False)
    finally:
        proc.stop()
    for res in (streamed, whole):
        assert res.ok, res.error_message
        assert res.usage.completion_tokens == 6 and res.usage.prompt_tokens > 0
        assert len(res.text.split()) == 6
    assert streamed.streamed and sum(streamed.chunk_tokens) == 6 and not whole.streamed
    assert streamed.text == whole.text  # the reply is a function of the prompt


def test_reasoning_opens_streamed_and_whole_replies() -> None:
    proc = SimProcess.start(["--profile", "tiny", "--time-scale", "0", "--reasoning-tokens", "2"])
    try:
        replies = {(a, s): _one(proc.url, a, stream=s) for a, _ in ADAPTERS for s in (True, False)}
    finally:
        proc.stop()
    for (adapter, streamed), res in replies.items():
        assert res.ok and res.output_tokens == 6, (adapter, res.error_message)
        assert len(res.text.split()) == 4 and "ponder" not in res.text  # the answer alone is the reply text
        if streamed:  # reasoning deltas first: the first answer token is the third token-bearing event
            assert res.reasoning_tokens == 2 and res.t_first_output_ns >= res.t_first_ns
        assert res.text == replies[(adapter, not streamed)].text
    assert replies[("openai-responses", False)].usage.reasoning_tokens == 2  # output_tokens_details


@pytest.mark.parametrize("adapter", [a for a, _ in ADAPTERS])
@pytest.mark.parametrize(
    ("fault", "category"),
    [("--fault-malformed", "bad_chunk"), ("--fault-cut", "stream_cut"), ("--fault-http-429", "http_429")],
)
def test_sim_faults_are_categorised(adapter, fault, category) -> None:
    proc = SimProcess.start(["--profile", "tiny", "--time-scale", "0", fault, "1"])
    try:
        res = _one(proc.url, adapter, max_tokens=12)
    finally:
        proc.stop()
    assert not res.ok and res.error_category == category, (res.error_category, res.error_message)
