"""Request-body validation of the sim's OpenAI-compatible endpoints, and what goes on the wire."""

from __future__ import annotations

import orjson
import pytest

from targets.sim.api import BadRequest, parse_request
from targets.sim.text import WORDS, reply_text, reply_words
from targets.sim.wire import CHAT, COMPLETIONS, StreamTemplate, full_response
from workloads.tokenizer import count_tokens, render_chat, token_ids

MSGS = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "list the files, please"}]


def test_chat_prompt_is_the_shared_tokenizer_on_the_rendered_chat():
    req = parse_request(CHAT, {"messages": MSGS, "max_tokens": 7, "stream": True}, 16)
    assert req.prompt_ids == token_ids(render_chat(MSGS))
    assert (req.max_tokens, req.stream, req.include_usage) == (7, True, False)


def test_completions_prompt_and_defaults():
    req = parse_request(COMPLETIONS, {"prompt": "hello world"}, 16)
    assert req.prompt_ids == token_ids("hello world")
    assert req.max_tokens == 16 and req.stream is False
    assert parse_request(COMPLETIONS, {"prompt": ["hi there"]}, 16).prompt_ids == token_ids("hi there")


def test_max_completion_tokens_wins_and_usage_option_is_read():
    body = {"messages": MSGS, "max_tokens": 3, "max_completion_tokens": 9, "stream_options": {"include_usage": True}}
    req = parse_request(CHAT, body, 16)
    assert req.max_tokens == 9 and req.include_usage


def test_unknown_fields_are_ignored_and_content_parts_are_joined():
    body = {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "a b"}, {"type": "image_url"}]}],
        "temperature": 0.3,
        "user": "session-1",
        "whatever": {"x": 1},
    }
    req = parse_request(CHAT, body, 16)
    assert req.prompt_ids == token_ids(render_chat([{"role": "user", "content": "a b"}]))


@pytest.mark.parametrize(
    "body",
    [
        [],
        {"messages": []},
        {"messages": "hi"},
        {"messages": [{"content": "no role"}]},
        {"messages": MSGS, "max_tokens": 0},
        {"messages": MSGS, "max_tokens": True},
        {"messages": MSGS, "max_tokens": "5"},
        {"messages": MSGS, "stream": "yes"},
        {"messages": MSGS, "stream_options": {"include_usage": 1}},
        {"messages": MSGS, "n": 2},
        {"messages": [{"role": "user", "content": 5}]},
    ],
)
def test_bad_chat_bodies_are_refused(body):
    with pytest.raises(BadRequest):
        parse_request(CHAT, body, 16)


def test_bad_completion_prompt_is_refused():
    for prompt in (None, 5, ["a", "b"], [1, 2]):
        with pytest.raises(BadRequest):
            parse_request(COMPLETIONS, {"prompt": prompt}, 16)
    with pytest.raises(BadRequest):
        parse_request(COMPLETIONS, {"prompt": "   "}, 16)  # no tokens


def test_reply_words_are_single_tokens_and_deterministic():
    ids = token_ids("some prompt here")
    assert reply_words(1, ids, 50) == reply_words(1, ids, 50)
    assert reply_words(1, ids, 20) == reply_words(1, ids, 50)[:20]  # longer extends shorter
    assert reply_words(2, ids, 50) != reply_words(1, ids, 50)
    assert count_tokens(reply_text(1, ids, 50)) == 50


def parse_sse(raw: bytes) -> list[dict]:
    out = []
    for block in raw.split(b"\n\n"):
        if block:
            assert block.startswith(b"data: ")
            out.append(orjson.loads(block[6:]))
    return out


def test_stream_chunks_have_the_openai_shape():
    tpl = StreamTemplate(CHAT, 'chatcmpl-"x"', 123, "m")
    role, tok, fin, usage = parse_sse(tpl.role() + tpl.token(3) + tpl.finish() + tpl.usage(10, 4, 8))
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert tok["id"] == 'chatcmpl-"x"' and tok["object"] == "chat.completion.chunk" and tok["model"] == "m"
    assert tok["choices"][0]["delta"] == {"content": " " + WORDS[3]}
    assert tok["choices"][0]["finish_reason"] is None
    assert fin["choices"][0]["finish_reason"] == "length" and fin["choices"][0]["delta"] == {}
    assert usage["choices"] == []
    assert usage["usage"] == {
        "prompt_tokens": 10,
        "total_tokens": 14,
        "completion_tokens": 4,
        "prompt_tokens_details": {"cached_tokens": 8},
    }
    text = StreamTemplate(COMPLETIONS, "cmpl-1", 1, "m")
    (chunk,) = parse_sse(text.token(0))
    assert chunk["object"] == "text_completion" and chunk["choices"][0]["text"] == " " + WORDS[0]


def test_malformed_chunk_is_not_json():
    raw = StreamTemplate(CHAT, "c", 1, "m").malformed()
    assert raw.startswith(b"data: ") and raw.endswith(b"\n\n")
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(raw[6:])


def test_full_response_bodies():
    chat = orjson.loads(full_response(CHAT, "c", 1, "m", " a b", 5, 2, 0))
    assert chat["object"] == "chat.completion"
    assert chat["choices"][0]["message"] == {"role": "assistant", "content": " a b"}
    assert chat["usage"]["total_tokens"] == 7
    comp = orjson.loads(full_response(COMPLETIONS, "c", 1, "m", " a b", 5, 2, 0))
    assert comp["choices"][0]["text"] == " a b"
