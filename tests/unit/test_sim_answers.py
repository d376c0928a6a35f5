"""The sim's known answers: which question a request asks, the file format, the streamed chunks."""

from __future__ import annotations

import pytest

from targets.sim.answers import (
    WRONG_ANSWER,
    AnswersError,
    answer_pieces,
    load_answers,
    question_of,
    reply_pieces,
)
from targets.sim.wire import CHAT, StreamTemplate
from workloads.tokenizer import render_chat

ANSWERS = {"What is the capital of France?": "Paris", "Name two colours.": 'red and "blue"'}


def test_the_question_is_the_last_user_message():
    body = {"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Name two colours."},
        {"role": "assistant", "content": "red"},
        {"role": "user", "content": "  What is the capital of France?\n"},
    ]}  # fmt: skip
    assert question_of(True, body) == "What is the capital of France?"
    assert question_of(True, {"messages": "nope"}) is None


def test_a_completions_prompt_asks_its_last_user_block_or_itself():
    prompt = render_chat([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name two colours."}])
    assert question_of(False, {"prompt": prompt}) == "Name two colours."
    assert question_of(False, {"prompt": [" Name two colours. "]}) == "Name two colours."


def test_known_questions_get_their_answer_or_the_wrong_one():
    body = {"messages": [{"role": "user", "content": "Name two colours."}]}
    assert reply_pieces(ANSWERS, False, True, body) == ["red", " and", ' "blue"']
    assert "".join(reply_pieces(ANSWERS, True, True, body)) == WRONG_ANSWER
    assert reply_pieces(ANSWERS, False, True, {"messages": [{"role": "user", "content": "Hi"}]}) is None
    assert reply_pieces(None, False, True, body) is None


def test_pieces_join_back_to_the_answer():
    for answer in ("Paris", "The capital is Paris.", "a\tb  c"):
        assert "".join(answer_pieces(answer)) == answer


def test_an_answer_chunk_is_valid_json_with_escapes():
    import orjson

    chunk = StreamTemplate(CHAT, "chatcmpl-1", 0, "m").text_token(' "blue"\\')
    obj = orjson.loads(chunk.removeprefix(b"data: ").strip())
    assert obj["choices"][0]["delta"]["content"] == ' "blue"\\'


def test_answers_file_accepts_an_eval_file_and_names_bad_lines(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_text('# c\n{"id": "x", "prompt": " Q? ", "answer": "A", "match": "contains"}\n')
    assert load_answers(p) == {"Q?": "A"}
    p.write_text('{"prompt": "Q?", "answer": "A"}\n{"prompt": "R?"}\n')
    with pytest.raises(AnswersError, match=r"a\.jsonl line 2: 'answer' must be a non-empty string"):
        load_answers(p)
    with pytest.raises(AnswersError, match="cannot read it"):
        load_answers(tmp_path / "missing.jsonl")
