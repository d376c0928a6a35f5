"""The ``openai-responses`` adapter's ``server_history`` option against the sim's truth.

One conversation of four turns (a tool call and its result among them), streamed and not: with
the option, every follow-up sends only its new items plus ``previous_response_id`` (the id of the
previous reply), and the sim, which keeps the responses it produced, must count as prompt
exactly the tokens of the whole history, which is what the same request without the option sends
(the sim's own parser on that body is the reference), while the bytes sent are fewer.
"""

from __future__ import annotations

import json

import orjson
import pytest

from targets.adapters.base import ChatRequest
from targets.adapters.responses import OpenAIResponsesAdapter
from targets.sim.api import parse_request
from targets.sim.wire_events import RESPONSES

from .runs import loadgen, records, run_dir, sim, truth

CALL = {
    "id": "call_read",
    "type": "function",
    "function": {"name": "read_file", "arguments": '{"task": "read"}'},
}
TURNS = [
    {"role": "user", "content": "The parser drops the last line of every file; find out why."},
    {
        "role": "tool",
        "tool_call_id": "call_read",
        "content": "def parse(text):\n    return text.splitlines()[:-1]",
    },
    {"role": "user", "content": "Good. Now fix it and keep the trailing newline case."},
    {"role": "user", "content": "Run the tests again."},
]


@pytest.mark.parametrize("stream", [True, False])
def test_server_history_sends_only_new_items_and_the_sim_counts_the_whole_history(tmp_path, stream) -> None:
    from loadgen.engine.client import SessionConnection

    adapter = OpenAIResponsesAdapter(ignore_eos=True, server_history=True)
    whole = OpenAIResponsesAdapter(ignore_eos=True, store=True)  # the same requests, history resent
    messages: list[dict] = [{"role": "system", "content": "You are a careful coding agent."}]
    sent, reference, previous = [], [], []
    with (
        sim(tmp_path, "--profile", "tiny", "--time-scale", "0") as (proc, truth_log),
        SessionConnection(proc.url) as conn,
    ):
        for k, turn in enumerate(TURNS):
            messages.append(turn)
            req = ChatRequest(
                messages=list(messages), max_tokens=12, session_id="s1", request_id=f"h{k}", stream=stream
            )
            full_body = orjson.loads(whole.build_request(req).body)
            prepared = adapter.build_request(req)
            res = conn.stream(prepared, adapter, deadline_s=20)
            assert res.ok, res.error_message
            body = orjson.loads(prepared.body)
            sent.append(len(prepared.body))
            reference.append(
                (len(whole.build_request(req).body), len(parse_request(RESPONSES, full_body, 16).prompt_ids))
            )
            previous.append((body.get("previous_response_id"), body["input"], body["store"]))
            # The server holds everything before this turn's message (the first turn: nothing).
            assert prepared.held_messages == (len(messages) - 1 if k else 0)
            reply: dict = {"role": "assistant", "content": res.text}
            if k == 0:  # the first reply is kept in the history as the call the tool result answers
                reply["tool_calls"] = [CALL]
            messages.append(reply)
    t = truth(truth_log)
    prompt_tokens = [t[f"h{k}"]["prompt_tokens"] for k in range(len(TURNS))]
    assert prompt_tokens == [tokens for _, tokens in reference]
    assert prompt_tokens[-1] > prompt_tokens[0] + 40  # the history did grow
    assert previous[0][0] is None and all(store for _, _, store in previous)
    for k in range(1, len(TURNS)):
        prev_id, items, _ = previous[k]
        assert prev_id == f"resp_h{k - 1}"  # the sim's id of the previous reply
        assert items[-1].get("content", items[-1].get("output")) == TURNS[k]["content"]
        assert sent[k] < reference[k][0]
    # Only the new items: the tool call the client kept, then its result; else the new message.
    assert [i["type"] for i in previous[1][1]] == ["function_call", "function_call_output"]
    assert [i["type"] for i in previous[2][1]] == ["message"]
    with_history_bytes, whole_bytes = sum(sent), sum(b for b, _ in reference)
    print(f"\n[server history] stream={stream}: {with_history_bytes} bytes sent vs {whole_bytes} resending "
          f"the history; prompt tokens {prompt_tokens} (equal to the whole history's)")  # fmt: skip


@pytest.mark.slow
def test_a_run_with_server_history_reports_what_it_sent_and_what_the_server_held(tmp_path) -> None:
    results = tmp_path / "results"
    with sim(tmp_path, "--profile", "tiny", "--time-scale", "0") as (proc, truth_log):
        r = loadgen(
            "run", "--target", proc.url, "--adapter", "openai-responses", "--adapter-options", "server_history=true",
            "--workload", "tiny", "--num-sessions", "4", "--rate", "8", "--seed", "3", "--results", str(results),
            "--max-schedule-lag", "10s",
        )  # fmt: skip
        assert r.returncode in (0, 4), r.stderr[-3000:]  # 4: a verdict on a busy machine, not a failure here
    recs = records(run_dir(results))
    t = truth(truth_log)
    assert recs and all(rec.ok for rec in recs)
    follow_ups = [rec for rec in recs if rec.turn_index > 0]
    assert follow_ups and all(rec.server_held_prompt_tokens for rec in follow_ups)
    assert all(rec.server_held_prompt_tokens is None for rec in recs if rec.turn_index == 0)
    for rec in recs:  # the sim counted the whole history: at least the client's count of it
        assert t[rec.request_id]["prompt_tokens"] == rec.prompt_tokens >= rec.client_prompt_tokens
    check = json.loads((run_dir(results) / "summary.json").read_text())["prompt_tokens_check"]
    held = sum(rec.server_held_prompt_tokens or 0 for rec in recs)
    assert check["server_held_tokens"] == held > 0
    assert check["sent_tokens"] == check["client_tokens"] - held
    run = json.loads((run_dir(results) / "run.json").read_text())
    assert run["config"]["adapter_options"] == {"server_history": True}
    print(f"\n[server history run] prompt tokens: server {check['server_tokens']}, client {check['client_tokens']}, "
          f"sent {check['sent_tokens']}, held by the server {held}")  # fmt: skip
