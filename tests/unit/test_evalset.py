"""Eval sets: the file format, its one-line errors, normalisation and the verdict on an answer."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadgen.commands.evalset import EvalItem, is_correct, load_eval_set, normalize
from loadgen.errors import UserError


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("Paris", "paris"),
        ("  Paris.  ", "paris"),
        ('"Paris!"', "paris"),
        ("**Paris**.", "paris"),
        ("New   York\n City", "new york city"),
        ("H₂O", "h2o"),  # NFKC: subscript two is a plain 2
        ("3.14", "3.14"),  # inner punctuation stays
        ("Is it?!", "is it"),
    ],
)
def test_normalize(text, want):
    assert normalize(text) == want


def test_exact_match_needs_the_whole_reply():
    item = EvalItem("x", "What colour is the sky?", "blue", accept=("light blue",))
    assert is_correct(item, "Blue.")
    assert is_correct(item, " LIGHT   blue ")
    assert not is_correct(item, "The sky is blue.")


def test_contains_match_needs_whole_words():
    item = EvalItem("x", "How many legs does a spider have?", "8", accept=("eight",), match="contains")
    assert is_correct(item, "A spider has 8 legs.")
    assert is_correct(item, "Eight.")
    assert not is_correct(item, "A spider has 18 legs.")
    assert not is_correct(item, "weight")


def test_the_shipped_set_is_small_unique_and_answerable():
    items = load_eval_set()
    assert 8 <= len(items) <= 20
    assert len({i.id for i in items}) == len(items)
    # Every item accepts its own answer, and none accepts the sim's deliberately wrong one.
    assert all(is_correct(i, i.answer) for i in items)
    assert not any(is_correct(i, "I do not know.") for i in items)


def _file(tmp_path: Path, *lines: str) -> Path:
    p = tmp_path / "eval.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return p


def test_a_file_with_comments_blank_lines_and_defaults(tmp_path):
    p = _file(tmp_path, "# my eval", "", '{"prompt": "2+2?", "answer": "4", "max_tokens": 4}')
    [item] = load_eval_set(p)
    assert (item.id, item.match, item.max_tokens, item.accept) == ("line-3", "exact", 4, ())


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "line 2: not JSON"),
        ("[1, 2]", "line 2: not a JSON object"),
        ('{"prompt": "q"}', "line 2: field 'answer' must be a non-empty string"),
        ('{"prompt": " ", "answer": "a"}', "line 2: field 'prompt' must be a non-empty string"),
        ('{"prompt": "q", "answer": "a", "accept": "b"}', "line 2: field 'accept' must be a list"),
        ('{"prompt": "q", "answer": "a", "match": "fuzzy"}', "line 2: field 'match' is 'fuzzy'; use one of exact, contains"),
        ('{"prompt": "q", "answer": "a", "max_tokens": 0}', "line 2: field 'max_tokens' must be a whole number"),
        ('{"prompt": "q", "answer": "a", "acept": ["b"]}', "line 2: unknown field 'acept'"),
        ('{"id": "one", "prompt": "q", "answer": "a"}', "line 2: id 'one' is already used on line 1"),
    ],
)
def test_malformed_lines_are_one_line_errors_naming_file_line_and_field(tmp_path, line, message):
    p = _file(tmp_path, '{"id": "one", "prompt": "p", "answer": "a"}', line)
    with pytest.raises(UserError) as e:
        load_eval_set(p)
    assert str(e.value).startswith(f"{p} {message}")
    assert "\n" not in str(e.value) and e.value.exit_code == 2


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        load_eval_set(tmp_path / "nope.jsonl")
    with pytest.raises(UserError, match="no items"):
        load_eval_set(_file(tmp_path, "# nothing"))


def test_run_refuses_a_malformed_eval_file_before_anything_starts(tmp_path):
    from click.testing import CliRunner

    from loadgen.cli import main

    bad = _file(tmp_path, '{"id": "a", "prompt": "Q?", "answer": "A"}', '{"prompt": "R?", "answer": "B", "match": "fuzzy"}')
    results = tmp_path / "results"
    r = CliRunner().invoke(main, ["run", "--quality-gate", "0.5", "--quality-eval", str(bad), "--results", str(results)])
    assert r.exit_code == 2
    assert r.output.strip().splitlines() == [f"Error: {bad} line 2: field 'match' is 'fuzzy'; use one of exact, contains"]
    assert not results.exists() or not any(results.iterdir())
