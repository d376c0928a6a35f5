"""The compiled chunk path for SGLang's native ``/generate`` stream (loadgen/engine/_chat.c:
take_sglang) against the Python adapter it stands for: the same events, in the same reads, leave
the same stream state (chunk times and tokens, text, usage, and the stream's own characters and
tokens seen) through ``_chat.ChatTaker.take`` as through ``StreamState.take``. The events carry
the whole text so far and a running token count, so they are generated as a stream: each one
grows (or, hostile, shrinks) the last one's text and count. Which events the C side takes itself
is checked too."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.engine import sse_state
from loadgen.engine.health import ChunkCounts
from loadgen.engine.outcome import StreamResult
from loadgen.engine.sse_state import StreamState
from targets.adapters.base import Usage
from targets.adapters.sglang import SGLangAdapter

from .test_compiled_chat_diff import _take_reads

_chat = sse_state._chat
pytestmark = pytest.mark.skipif(_chat is None, reason="the compiled chunk path is not built (make setup builds it)")

SGLANG = "sglang"


def _run(reads: list[list[bytes]], incremental: bool, compiled: bool) -> list:
    stream = SGLangAdapter(incremental_text=incremental).new_stream()
    s = StreamState(stream.parse_line, StreamResult(), ChunkCounts())
    take = _chat.ChatTaker(s, stream, SGLANG, Usage).take if compiled else s.take
    return [(*r, stream.seen_chars, stream.seen_tokens) for r in _take_reads(reads, s, stream, take)]


def _same(reads: list[list[bytes]]) -> None:
    for incremental in (False, True):
        assert _run(reads, incremental, True) == _run(reads, incremental, False), (incremental, reads)


PIECE = st.text(st.characters(blacklist_categories=("Cs",)), max_size=4) | st.sampled_from(["", " the", "é", "\n", '"', "\U0001f600"])
ODD = st.sampled_from([None, 0, -1, 1.5, 3.0, True, "7", [], {}, 10**20])


@st.composite
def _events(draw) -> list[bytes]:
    text, count, lines = "", 0, []
    for _ in range(draw(st.integers(1, 8))):
        text = text + draw(PIECE) if draw(st.integers(0, 7)) else text[: draw(st.integers(0, len(text)))]
        count += draw(st.sampled_from([0, 1, 1, 1, 2, 5, -1]))
        obj: dict = {}
        if draw(st.integers(0, 9)):
            obj["text"] = text if draw(st.integers(0, 9)) else draw(ODD)
        if draw(st.integers(0, 7)):
            meta: dict = {"id": "r1"}
            for key, value in (("prompt_tokens", 12), ("completion_tokens", count), ("cached_tokens", 4)):
                if draw(st.integers(0, 5)):
                    meta[key] = value if draw(st.integers(0, 7)) else draw(ODD)
            if draw(st.integers(0, 9)) == 0:
                meta["finish_reason"] = draw(st.sampled_from([None, {"type": "length"}]))
                meta["e2e_latency"] = 0.5
            obj["meta_info"] = meta if draw(st.integers(0, 19)) else draw(ODD)
        if draw(st.integers(0, 19)) == 0:
            obj[draw(st.sampled_from(["error", "object"]))] = draw(st.sampled_from(["error", {"message": "x"}, None]))
        if draw(st.integers(0, 3)) == 0:
            obj["output_ids"] = list(range(draw(st.integers(0, 3))))
        body = json.dumps(obj, ensure_ascii=draw(st.integers(0, 5)) == 0, separators=(",", ":")).encode()
        lines.append(draw(st.sampled_from([b"data: ", b"data: ", b"data:"])) + body + draw(st.sampled_from([b"", b"\r"])))
        if draw(st.integers(0, 9)) == 0:
            lines.append(draw(st.sampled_from([b"", b"data: [DONE]", b": ping", b"data: {", b"event: x"])))
    return lines


@settings(max_examples=500, deadline=None)
@given(_events(), st.lists(st.integers(0, 8), max_size=4))
def test_the_compiled_sglang_path_leaves_the_python_paths_state(lines: list[bytes], cuts: list[int]) -> None:
    reads, at = [], 0
    for c in [*sorted(cuts), len(lines)]:
        reads.append(lines[at:c])
        at = max(at, c)
    _same([r for r in reads if r] or [lines])


def test_a_typical_stream_is_taken_in_c_and_equals_the_python_path() -> None:
    def ev(text: str, n: int, finish: object = None, escaped: bool = False) -> bytes:
        meta = {"id": "r", "prompt_tokens": 9, "completion_tokens": n, "cached_tokens": 3}
        if finish is not None:
            meta |= {"finish_reason": finish, "e2e_latency": 0.25}
        obj = {"text": text, "output_ids": [1], "meta_info": meta}
        return b"data: " + json.dumps(obj, ensure_ascii=escaped).encode()

    lines = [
        ev("", 0), ev("Hel", 1), ev("Hello", 3), ev("Hello é", 4, escaped=True), ev("Hello é w", 5),
        ev("Hello é world", 6, {"type": "length"}), b"data: [DONE]",
    ]  # fmt: skip
    _same([[x] for x in lines])
    _same([lines])
    stream = SGLangAdapter().new_stream()
    s = StreamState(stream.parse_line, StreamResult(), ChunkCounts())
    taker = _chat.ChatTaker(s, stream, SGLANG, Usage)
    assert [taker.take([x], 5) for x in lines] == [False] * 6 + [True]
    assert s.chunk_tokens == [1, 2, 1, 1, 1] and "".join(s.parts) == "Hello é world" and s.done
    assert s.usage == Usage(9, 6, 3) and s.timings == {"e2e_latency": 0.25}
    # The C side takes every event but the last (its engine timings) and the one with an escape.
    stream2 = SGLangAdapter().new_stream()
    s2 = StreamState(lambda line: pytest.fail(f"handed to Python: {line!r}"), StreamResult(), ChunkCounts())
    taker2 = _chat.ChatTaker(s2, stream2, SGLANG, Usage)
    for x in lines[:3] + lines[4:5] + lines[6:]:
        taker2.take([x], 5)
    assert s2.chunk_tokens == [1, 2, 2] and "".join(s2.parts) == "Hello é w" and s2.done


def test_the_worker_takes_sglang_streams_in_c() -> None:
    stream = SGLangAdapter().new_stream()
    s = StreamState(stream.parse_line, StreamResult(), ChunkCounts())
    take = sse_state.stream_take(s)
    assert getattr(take, "__self__", None).__class__.__name__ == ("ChatTaker" if sse_state.READER == "compiled" else "StreamState")
    with pytest.raises(TypeError, match="Usage"):
        _chat.ChatTaker(s, stream, SGLANG)
