"""Replies that end before max_tokens: a profile's ``eos_lengths`` draws each reply's length, and
every API says so (``finish_reason: stop``, ``stop_reason: end_turn``, Responses ``completed``),
with the truth log holding the drawn length and the reason."""

from __future__ import annotations

import orjson

from targets.sim.process import SimProcess

from .runs import truth
from .test_sim_server import get_json, run, stream

MAX_TOKENS = 40
EOS = {"dist": "lognormal", "median": 12, "sigma": 0.6, "max": 200}
PROMPTS = [f"task {i}: read the file and report" for i in range(6)]


def body(endpoint: str, prompt: str, stream_: bool, **extra) -> tuple[str, dict]:
    if endpoint == "chat":
        return "/v1/chat/completions", {
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": MAX_TOKENS,
            "stream": stream_,
            "stream_options": {"include_usage": True},
            **extra,
        }
    if endpoint == "messages":
        return "/v1/messages", {
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": MAX_TOKENS,
            "stream": stream_,
            **extra,
        }
    return "/v1/responses", {"input": prompt, "max_output_tokens": MAX_TOKENS, "stream": stream_, **extra}  # fmt: skip


def finish_on_the_wire(endpoint: str, res) -> str:
    """The reply's end in each API's words, mapped to stop/length."""
    objs = [c for _, c in res.chunks] if res.chunks else [orjson.loads(res.body)]  # a stream, or a body
    if endpoint == "chat":
        reasons = [
            ch["finish_reason"] for o in objs for ch in o.get("choices") or [] if ch.get("finish_reason")
        ]
        return reasons[-1]
    if endpoint == "messages":
        reasons = [
            o.get("delta", o).get("stop_reason")
            for o in objs
            if o.get("type") in ("message_delta", "message")
        ]
        return {"end_turn": "stop", "max_tokens": "length"}[reasons[-1]]
    ends = ("response.completed", "response.incomplete")
    status = [
        o.get("response", o)["status"] for o in objs if o.get("type") in ends or o.get("object") == "response"
    ]
    return {"completed": "stop", "incomplete": "length"}[status[-1]]


def test_eos_lengths_end_replies_with_stop_on_every_api(tmp_path) -> None:
    log = tmp_path / "truth.jsonl"  # the knob from the command line (a profile file works alike)
    flags = ["--eos-lengths", orjson.dumps(EOS).decode(), "--time-scale", "0", "--seed", "3"]
    sim = SimProcess.start(["--profile", "tiny", *flags, "--truth-log", str(log)])
    sent: dict[str, str] = {}
    try:
        _send_all(sim.url, sent)
        info = run(get_json(sim.url, "/sim/info"))[1]
    finally:
        sim.stop()
    assert info["behaviour"] == {"reasoning_tokens": 0, "eos_lengths": EOS, "preemption": False, "tool_calls": None}
    t = truth(log)
    reasons = []
    for rid, wire in sent.items():
        tr = t[rid]
        assert tr["finish_reason"] == wire, rid
        if rid.endswith("-ignore"):
            assert (wire, tr["completion_tokens"], tr["eos_length"]) == ("length", MAX_TOKENS, None)
            continue
        drawn = tr["eos_length"]
        assert 1 <= drawn <= 200
        assert tr["completion_tokens"] == min(drawn, MAX_TOKENS)
        assert wire == ("stop" if drawn <= MAX_TOKENS else "length"), rid
        reasons.append(wire)
    assert reasons.count("stop") >= len(reasons) // 2  # median 12 of 40: most replies stop early
    # The length is a function of the prompt: the same conversation ends at the same token everywhere.
    for i in range(len(PROMPTS)):
        lengths = {
            t[f"{e}-{i}-{s}"]["eos_length"] for e in ("chat", "messages", "responses") for s in (True, False)
        }
        assert len(lengths) == 1, (i, lengths)


def _send_all(url: str, sent: dict[str, str]) -> None:
    """Each prompt streamed and not on every API, and one ignore_eos request per API."""
    for endpoint in ("chat", "messages", "responses"):
        for i, prompt in enumerate(PROMPTS):
            for stream_ in (True, False):
                rid = f"{endpoint}-{i}-{stream_}"
                path_, b = body(endpoint, prompt, stream_)
                res = run(stream(url, path_, b, headers={"X-Request-ID": rid}))
                assert res.status == 200, res.body
                sent[rid] = finish_on_the_wire(endpoint, res)
        path_, b = body(endpoint, PROMPTS[0], True, ignore_eos=True)  # vLLM's extension: run to max_tokens
        res = run(stream(url, path_, b, headers={"X-Request-ID": f"{endpoint}-ignore"}))
        sent[f"{endpoint}-ignore"] = finish_on_the_wire(endpoint, res)
