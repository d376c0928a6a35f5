"""Capture: redaction keeps length and token count, the session file stays readable, replies are metered."""

from __future__ import annotations

import gzip
import random

import orjson
import pytest

from loadgen.capture.conversations import CapturedTurn
from loadgen.capture.redact import redact
from loadgen.capture.reply import Reply, ReplyMeter
from loadgen.capture.writer import SessionRenderer, SessionSnapshot, SessionWriter
from workloads import load_workload
from workloads.tokenizer import count_tokens

_ALPHABET = "abcXYZ019_ éßж中文 \n\t.,;:!?()[]{}<>|/\\'\"-+=*&^%$#@~`\u0301\u00a0"


@pytest.mark.parametrize(
    "text",
    [
        "Fix the failing test in parser.py (line 37): expected 'a', got \"b\".",
        "averyveryverylongidentifier_with_digits_123456789 and <|user|> markers <|Bad|> <|",
        "多语言文本 и кириллицей and naïve café\u0301 — em-dash…",
        "",
    ],
)
def test_redaction_keeps_length_and_token_count_and_hides_words(text: str) -> None:
    out = redact(text)
    assert len(out) == len(text)
    assert count_tokens(out) == count_tokens(text)
    for word in ("parser", "failing", "identifier", "кириллицей", "café"):
        assert word not in out
    assert out.count("<|user|>") == text.count("<|user|>")


def test_redaction_keeps_token_count_on_random_text() -> None:
    rng = random.Random(7)
    for _ in range(500):
        text = "".join(rng.choice(_ALPHABET) for _ in range(rng.randint(0, 80)))
        out = redact(text)
        assert (len(out), count_tokens(out)) == (len(text), count_tokens(text)), repr(text)
        assert redact(text) == out  # the same text always gives the same filler (shared prefixes stay shared)


def _snap(seq: int, sid: str, n_turns: int, system: str = "sys", arrival_s: float = 100.5) -> SessionSnapshot:
    turns = tuple(CapturedTurn(f"turn {i} of {sid}", "user" if i % 2 == 0 else "tool", 3 + i, 0.5 * i)
                  for i in range(n_turns))  # fmt: skip
    return SessionSnapshot(seq, sid, arrival_s, system, turns)


def test_the_file_is_a_valid_session_file_after_every_write_even_when_the_open_tail_shrinks(tmp_path) -> None:
    path = tmp_path / "cap.jsonl"
    writer = SessionWriter(path)
    renderer = SessionRenderer(tenant="prod", origin_s=100.0)
    try:
        long_b = _snap(2, "b", 3, system="a much longer system prompt " * 20, arrival_s=101.25)
        steps = [  # (closed, open, the lines' ids)
            ([], [_snap(1, "a", 1), long_b], ["a", "b"]),
            ([long_b], [_snap(1, "a", 2)], ["b", "a"]),
            ([], [_snap(1, "a", 3)], ["b", "a"]),
            ([_snap(1, "a", 3)], [], ["b", "a"]),
        ]
        for closed, open_, ids in steps:
            writer.write([renderer.line(s) for s in closed], [renderer.line(s) for s in open_])
            for s in closed:
                renderer.forget(s.seq)
            lines = [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
            assert [line["id"] for line in lines] == ids
            wl = load_workload(str(path))  # the reader orders sessions by arrival_s
            assert [wl.session(0, k).session_id for k in range(wl.num_sessions)] == ["a", "b"]
    finally:
        writer.close()
    assert {line["id"]: line["arrival_s"] for line in lines} == {"a": 0.5, "b": 1.25}
    a = load_workload(str(path)).session(0, 0)
    assert a.tenant == "prod" and a.system_prompt == "sys"
    assert [(t.content, t.role, t.max_tokens, t.think_time_s) for t in a.turns] == [
        ("turn 0 of a", "user", 3, 0.0),
        ("turn 1 of a", "tool", 4, 0.5),
        ("turn 2 of a", "user", 5, 1.0),
    ]
    assert path.read_bytes().endswith(b"]}\n")  # cut to size once the longer tail is gone


def test_redacted_file_has_the_same_token_counts(tmp_path) -> None:
    plain, hidden = SessionRenderer(tenant="t"), SessionRenderer(tenant="t", redactor=redact)
    snap = _snap(1, "s", 2, system="Secret system prompt: key=abc123!")
    a, b = orjson.loads(plain.line(snap)), orjson.loads(hidden.line(snap))
    assert "Secret" not in b["system_prompt"] and "turn" not in b["turns"][0]["content"]
    assert count_tokens(a["system_prompt"]) == count_tokens(b["system_prompt"])
    for ta, tb in zip(a["turns"], b["turns"], strict=True):
        assert count_tokens(ta["content"]) == count_tokens(tb["content"])
        assert {k: v for k, v in ta.items() if k != "content"} == {
            k: v for k, v in tb.items() if k != "content"
        }


def _sse(*objs: object) -> bytes:
    return b"".join(b"data: " + (o if isinstance(o, bytes) else orjson.dumps(o)) + b"\n\n" for o in objs)


def _chunk(text: str) -> dict:
    return {"choices": [{"index": 0, "delta": {"content": text}}]}


def test_a_stream_split_anywhere_is_metered_with_usage_winning_over_chunk_counts() -> None:
    body = _sse(
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        _chunk(" a"), _chunk(" b"), _chunk(" c"),
        {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4}},
        b"[DONE]",
    )  # fmt: skip
    for cut in range(1, len(body), 7):
        meter = ReplyMeter("chat", content_type="text/event-stream; charset=utf-8", content_encoding="")
        meter.feed(body[:cut])
        assert not meter.stream_done
        meter.feed(body[cut:])
        assert meter.stream_done
        reply = meter.finish()
        assert reply is not None and reply.output_tokens == 4  # a chat reply's text is not needed
    no_usage = ReplyMeter("chat", content_type="text/event-stream", content_encoding="")
    no_usage.feed(_sse(_chunk(" a"), _chunk(" b"), b"[DONE]"))
    assert no_usage.finish() == Reply(2, " a b")
    text = ReplyMeter("completions", content_type="text/event-stream", content_encoding="")
    text.feed(
        _sse({"choices": [{"index": 0, "text": " x y"}]}, {"choices": [], "usage": {"completion_tokens": 2}})
    )
    assert text.finish() == Reply(2, " x y")  # the next prompt holds it: kept


def test_error_replies_are_not_recorded_and_compressed_bodies_are_read() -> None:
    err = ReplyMeter("chat", content_type="text/event-stream", content_encoding="")
    err.feed(_sse(_chunk(" a"), {"error": {"message": "overloaded", "code": 503}}))
    assert err.finish() is None
    body = {"choices": [{"index": 0, "text": " one two three"}], "usage": {"completion_tokens": 3}}
    zipped = ReplyMeter("completions", content_type="application/json", content_encoding="gzip")
    data = gzip.compress(orjson.dumps(body))
    zipped.feed(data[:10])
    zipped.feed(data[10:])
    assert zipped.finish().output_tokens == 3
    counted = ReplyMeter("chat", content_type="application/json", content_encoding="")
    counted.feed(orjson.dumps({"choices": [{"index": 0, "message": {"content": "four words right here"}}]}))
    assert counted.finish().output_tokens == 4  # no usage: the text's tokens
    assert ReplyMeter("chat", content_type="application/json", content_encoding="br").finish() is None



def test_a_reply_too_big_to_keep_is_recorded_only_when_its_usage_says_its_length(monkeypatch) -> None:
    import loadgen.capture.reply as reply_mod

    monkeypatch.setattr(reply_mod, "MAX_HELD_BYTES", 400)
    chunks = [_chunk(f" w{j}") for j in range(20)]  # ~60 bytes a line: over 400 bytes held
    for usage in (False, True):
        meter = ReplyMeter("chat", content_type="text/event-stream", content_encoding="")
        body = _sse(
            *chunks, *([{"choices": [], "usage": {"completion_tokens": 20}}] if usage else []), b"[DONE]"
        )
        for k in range(0, len(body), 50):
            meter.feed(body[k : k + 50])
        assert meter.stream_done
        assert meter.finish() == (Reply(20, "") if usage else None)
    small = ReplyMeter("chat", content_type="text/event-stream", content_encoding="")
    small.feed(_sse(*chunks[:3], b"[DONE]"))
    assert small.finish() == Reply(3, " w0 w1 w2")
