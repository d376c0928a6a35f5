"""Capture round trip for the agent APIs: a scripted agent speaking Anthropic Messages or OpenAI
Responses goes through the capture proxy to the sim; replaying the capture with the matching
adapter reproduces the sessions.

The agent runs three sessions, their turns interleaved on one connection each, with no session
header: Messages sessions are told apart by history prefix (each request resends the history,
``tool_use``/``tool_result`` blocks included), Responses sessions by ``previous_response_id``
(each request sends only its new items, a ``function_call`` and its ``function_call_output``
among them). Some replies stream, some come whole. The agent names its tools and calls as a
loadgen replay does (``call_<step>``, ``{"task": "<step>"}``, "Run NAME and return its output."),
so what the replay sends renders to the same tokens; what is checked is what the capture kept.

Ground truth and margins:
* sessions, turns, turn texts, roles, the tool each result answers: exact, against the script;
* output lengths: exact (the agent asks for them; the sim honours max tokens);
* think time per turn: against the agent's own view of the gap (its send minus the end of the
  previous reply it read): median error <= 8 ms and none over 30 ms, never shorter than the
  agent's sleep (less 1 ms) -- the margins of test_capture_round_trip.py for the same two busy
  cores;
* replay: per (session, turn) the sim's prompt tokens within 1% of the original's (the sim
  charged a continued response its whole history), output lengths exact, and the replay waits
  exactly the captured think times (to the record's 1 us). The Responses replay runs with
  ``server_history`` itself, so it too sends only new items and the sim adds the history.
"""

from __future__ import annotations

import http.client
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson
import pytest

from loadgen.capture import proxy
from loadgen.capture.process import CaptureProcess
from workloads import load_workload

from .runs import loadgen, records, run_dir, sim, truth

pytestmark = pytest.mark.slow

# The relay decides which exchanges reach the assembler. Until it hands over /v1/messages and
# /v1/responses (loadgen.capture.apis.endpoint_of), and its recorder meters a reply as its
# request's API (ReplyMeter(pending.endpoint, ...)) and passes the reply's response_id and calls
# to SessionAssembler.complete, nothing of these APIs is recorded.
RELAY_HANDS_OVER = getattr(proxy, "endpoint_of", lambda *_: None)("POST", "/v1/messages") is not None

SESSIONS, TOOL = 3, "read_file"
TOOL_DESCRIPTION = f"Run {TOOL} and return its output."
# Per session: (kind, text) of turns 1.. after the first user message; "tool" answers a call.
SCRIPT = [
    ("tool", "def parse(text):\n    return text.splitlines()[:-1]"),
    ("user", "Now fix it and run the tests."),
]


@dataclass
class AgentSession:
    index: int
    stream: bool
    system: str
    first: str
    history: list = field(default_factory=list)  # Messages: the messages so far
    previous_id: str | None = None  # Responses: the last reply's id
    sent: list = field(default_factory=list)  # per turn: (request id, perf_counter at send)
    ends: list = field(default_factory=list)  # per turn: perf_counter when the reply was read
    sleeps: list = field(default_factory=list)


def _post(
    conn: http.client.HTTPConnection, path: str, body: dict, request_id: str, stream: bool
) -> tuple[bytes, float, float]:
    headers = {
        "Content-Type": "application/json",
        "X-Request-ID": request_id,
        "anthropic-version": "2023-06-01",
    }
    t_send = time.perf_counter()
    conn.request("POST", path, body=orjson.dumps(body), headers=headers)
    resp = conn.getresponse()
    data = resp.read()  # the whole reply, streamed or not; its end is what the proxy times
    t_end = time.perf_counter()
    assert resp.status == 200, data[:300]
    return data, t_send, t_end


def _events(data: bytes) -> list[dict]:
    return [orjson.loads(line[5:]) for line in data.split(b"\n") if line.startswith(b"data:")]


def _messages_reply(data: bytes, stream: bool) -> str:
    if not stream:
        return "".join(b["text"] for b in orjson.loads(data)["content"] if b["type"] == "text")
    return "".join(
        e["delta"]["text"]
        for e in _events(data)
        if e["type"] == "content_block_delta" and e["delta"]["type"] == "text_delta"
    )


def _responses_reply(data: bytes, stream: bool) -> str:
    resp = (
        orjson.loads(data)
        if stream is False
        else next(
            e["response"] for e in _events(data) if e["type"] in ("response.completed", "response.incomplete")
        )
    )
    return resp["id"]


def _messages_turn(s: AgentSession, k: int, max_tokens: int) -> dict:
    if k == 0:
        s.history.append({"role": "user", "content": s.first})
    else:
        kind, text = SCRIPT[k - 1]
        reply = s.history.pop()
        if kind == "tool":  # the reply is kept as the call the result answers
            step = f"t{k}"
            call = {"type": "tool_use", "id": f"call_{step}", "name": TOOL, "input": {"task": step}}
            s.history.append(
                {"role": "assistant", "content": [{"type": "text", "text": reply["content"]}, call]}
            )
            s.history.append(
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": f"call_{step}", "content": text}],
                }
            )
        else:
            s.history.append(reply)
            s.history.append({"role": "user", "content": text})
    body = {
        "model": "m",
        "max_tokens": max_tokens,
        "system": s.system,
        "messages": s.history,
        "stream": s.stream,
        "ignore_eos": True,
    }
    body["tools"] = [
        {
            "name": TOOL,
            "description": TOOL_DESCRIPTION,
            "input_schema": {"type": "object", "properties": {"task": {"type": "string"}}},
        }
    ]
    return body


def _responses_turn(s: AgentSession, k: int, max_tokens: int) -> dict:
    if k == 0:
        items: list[dict] = [{"type": "message", "role": "user", "content": s.first}]
    else:
        kind, text = SCRIPT[k - 1]
        if kind == "tool":
            step = f"t{k}"
            items = [
                {
                    "type": "function_call",
                    "call_id": f"call_{step}",
                    "name": TOOL,
                    "arguments": orjson.dumps({"task": step}).decode(),
                },
                {"type": "function_call_output", "call_id": f"call_{step}", "output": text},
            ]
        else:
            items = [{"type": "message", "role": "user", "content": text}]
    body = {"model": "m", "instructions": s.system, "input": items, "max_output_tokens": max_tokens,
            "stream": s.stream, "store": True, "ignore_eos": True}  # fmt: skip
    body["tools"] = [
        {"type": "function", "name": TOOL, "description": TOOL_DESCRIPTION, "parameters": {"type": "object"}}
    ]
    if s.previous_id is not None:
        body["previous_response_id"] = s.previous_id
    return body


def _run_agent(api: str, port: int, rng: random.Random) -> tuple[list[AgentSession], dict[str, int]]:
    """Every session's turns, interleaved; returns the sessions and each request's max tokens."""
    path = "/v1/messages" if api == "messages" else "/v1/responses"
    sessions = [
        AgentSession(i, stream=i != 1, system=f"You are coding agent number {i} of the {api} team.",
                     first=f"Session {i}: the parser drops the last line of file{i}.txt; find out why.")
        for i in range(SESSIONS)
    ]  # fmt: skip
    conns = [http.client.HTTPConnection("127.0.0.1", port, timeout=20) for _ in sessions]
    max_tokens: dict[str, int] = {}
    try:
        for k in range(1 + len(SCRIPT)):
            for s, conn in zip(sessions, conns, strict=True):
                if k:
                    pause = rng.uniform(0.05, 0.15)
                    s.sleeps.append(pause)
                    time.sleep(max(0.0, s.ends[-1] + pause - time.perf_counter()))
                n = rng.randint(6, 14)
                body = _messages_turn(s, k, n) if api == "messages" else _responses_turn(s, k, n)
                rid = f"{api}-{s.index}-{k}"
                data, t_send, t_end = _post(conn, path, body, rid, s.stream)
                max_tokens[rid] = n
                s.sent.append((rid, t_send))
                s.ends.append(t_end)
                if api == "messages":
                    s.history.append({"role": "assistant", "content": _messages_reply(data, s.stream)})
                else:
                    s.previous_id = _responses_reply(data, s.stream)
    finally:
        for conn in conns:
            conn.close()
    return sessions, max_tokens


@pytest.mark.xfail(
    not RELAY_HANDS_OVER,
    reason="the relay records chat/completions only: proxy.endpoint_of, the recorder's ReplyMeter endpoint and "
    "its complete() call need loadgen.capture.apis.endpoint_of, pending.endpoint and reply.response_id/calls",
    strict=True,
)
@pytest.mark.parametrize(
    ("api", "adapter", "options"),
    [("messages", "anthropic-messages", ""), ("responses", "openai-responses", "server_history=true")],
)
def test_agent_api_captures_replay_like_the_original(
    tmp_path: Path, capsys, api: str, adapter: str, options: str
) -> None:
    out = tmp_path / "captured.jsonl"
    with sim(tmp_path, "--profile", "tiny", "--time-scale", "4", "--seed", "3") as (proc, truth_log):
        cap = CaptureProcess.start(["--upstream", proc.url, "--out", str(out)])
        try:
            agents, max_tokens = _run_agent(api, cap.port, random.Random(5))
        finally:
            assert cap.stop() == 0, cap.stderr()
        wl = load_workload(str(out))
        assert wl.num_sessions == SESSIONS, out.read_text()[:2000]  # before the replay: a quick failure
        results = tmp_path / "results"
        r = loadgen(
            "run", "--target", proc.url, "--adapter", adapter, "--adapter-options", options,
            "--workload", str(out), "--num-sessions",
            str(SESSIONS), "--results", str(results), "--max-schedule-lag", "5s",
        )  # fmt: skip
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    original = truth(truth_log)
    captured = {s.turns[0].content: s for s in wl.sessions(0, wl.num_sessions)}
    assert set(captured) == {a.first for a in agents}
    replay: dict[str, list] = {}
    for rec in sorted(records(run_dir(results)), key=lambda r: (r.session_id, r.turn_index)):
        assert rec.ok, rec.error_message
        replay.setdefault(rec.session_id, []).append(rec)
    think_err_ms, prompt_err = [], []
    for a in agents:
        c = captured[a.first]
        assert c.system_prompt == a.system
        assert [(t.content, t.role, t.tool_call) for t in c.turns] == [
            (a.first, "user", None),
            *((text, kind, TOOL if kind == "tool" else None) for kind, text in SCRIPT),
        ]
        assert [t.max_tokens for t in c.turns] == [max_tokens[rid] for rid, _ in a.sent]
        assert [t.max_tokens for t in c.turns] == [original[rid]["completion_tokens"] for rid, _ in a.sent]
        for k in range(1, len(c.turns)):
            wire_gap_s = a.sent[k][1] - a.ends[k - 1]
            think_err_ms.append(abs(c.turns[k].think_time_s - wire_gap_s) * 1000)
            assert c.turns[k].think_time_s >= a.sleeps[k - 1] - 0.001, (a.index, k)
        again = replay[c.session_id]
        assert [r.output_tokens for r in again] == [t.max_tokens for t in c.turns]
        for k, (rec, (rid, _)) in enumerate(zip(again, a.sent, strict=True)):
            prompt_err.append(
                abs(rec.prompt_tokens - original[rid]["prompt_tokens"]) / original[rid]["prompt_tokens"]
            )
            if k:
                waited_s = (rec.t_sched_us - again[k - 1].t_end_us) / 1e6
                assert abs(waited_s - c.turns[k].think_time_s) <= 2e-6
    with capsys.disabled():
        print(
            f"\n[capture {api}] {SESSIONS} sessions, {SESSIONS * (1 + len(SCRIPT))} turns; think time vs the agent's gap "
            f"|err| p50 {np.median(think_err_ms):.2f} ms, max {max(think_err_ms):.2f} ms; replay prompt tokens "
            f"max rel err {max(prompt_err):.4f}"
        )
    assert np.median(think_err_ms) <= 8.0 and max(think_err_ms) <= 30.0
    assert max(prompt_err) <= 0.01
