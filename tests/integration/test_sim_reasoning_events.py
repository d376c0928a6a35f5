"""The event streams of a reply that reasons, as each API lays them out: Messages a ``thinking``
block at index 0 then the ``text`` block at index 1; Responses a ``reasoning`` item at output
index 0 then the ``message`` item at 1, every event numbered in order."""

from __future__ import annotations

import orjson

from targets.sim.process import SimProcess

from .test_sim_server import run, stream

R, N = 3, 8  # reasoning tokens, tokens in all


def _events(url: str, path: str, body: dict) -> list[dict]:
    res = run(stream(url, path, body))
    assert res.status == 200 and not res.bad_lines
    return [c for _, c in res.chunks]


def test_messages_and_responses_streams_put_reasoning_in_its_own_block() -> None:
    sim = SimProcess.start(["--profile", "tiny", "--time-scale", "0", "--reasoning-tokens", str(R)])
    try:
        msg = [{"role": "user", "content": "plan the change"}]
        messages = _events(sim.url, "/v1/messages", {"messages": msg, "max_tokens": N, "stream": True})
        responses = _events(
            sim.url, "/v1/responses", {"input": "plan the change", "max_output_tokens": N, "stream": True}
        )
        whole = orjson.loads(run(stream(sim.url, "/v1/messages", {"messages": msg, "max_tokens": N})).body)
    finally:
        sim.stop()

    # Messages: block 0 opens as thinking, takes R thinking deltas and a signature, closes; block 1
    # is the text block with the N - R answer tokens; the usage counts all N.
    blocks = [(e["type"], e.get("index"), (e.get("delta") or e.get("content_block") or {}).get("type"))
              for e in messages if e["type"].startswith("content_block")]  # fmt: skip
    assert blocks == [
        ("content_block_start", 0, "thinking"), *[("content_block_delta", 0, "thinking_delta")] * R,
        ("content_block_delta", 0, "signature_delta"), ("content_block_stop", 0, None),
        ("content_block_start", 1, "text"), *[("content_block_delta", 1, "text_delta")] * (N - R),
        ("content_block_stop", 1, None),
    ]  # fmt: skip
    assert messages[-2]["usage"]["output_tokens"] == N
    assert [b["type"] for b in whole["content"]] == ["thinking", "text"]
    assert (
        whole["content"][0]["thinking"].split() == ["ponder"] * R
        and len(whole["content"][1]["text"].split()) == N - R
    )

    # Responses: sequence numbers 0, 1, 2, ...; reasoning deltas on the reasoning item (output 0),
    # text deltas on the message item (output 1); the final response holds both, reasoning counted.
    assert [e["sequence_number"] for e in responses] == list(range(len(responses)))
    kinds = [(e["type"], e.get("output_index")) for e in responses]
    assert kinds.count(("response.reasoning_text.delta", 0)) == R
    assert kinds.count(("response.output_text.delta", 1)) == N - R
    first_text = kinds.index(("response.output_text.delta", 1))
    assert kinds.index(("response.output_item.done", 0)) < first_text  # reasoning done before the answer
    final = responses[-1]["response"]
    assert [item["type"] for item in final["output"]] == ["reasoning", "message"]
    assert (
        final["usage"]["output_tokens"] == N
        and final["usage"]["output_tokens_details"]["reasoning_tokens"] == R
    )
