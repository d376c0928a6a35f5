"""Quality eval sets: the JSONL file format, answer normalisation and the verdict on one answer.

One JSON object a line (blank lines and ``#`` comments are skipped)::

    {"id": "capital-france", "prompt": "What is the capital of France?", "answer": "Paris",
     "accept": ["Paris, France"], "match": "contains", "max_tokens": 32}

``prompt`` and ``answer`` are required; ``id`` defaults to ``line-N``; ``accept`` lists other
correct answers; ``match`` is ``exact`` (default: the whole normalised reply is a correct answer)
or ``contains`` (a correct answer appears in the normalised reply as whole words);
``max_tokens`` (default 32) bounds the reply. Normalisation (``normalize``): Unicode NFKC, case
folded, runs of whitespace as one space, and surrounding quotes, markdown emphasis and trailing
punctuation (``. , ; : ! ?``) removed. docs/quality.md is the user-facing copy.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import orjson

from loadgen.errors import UserError

__all__ = ["DEFAULT_MAX_TOKENS", "MATCH_MODES", "EvalItem", "default_eval_path", "is_correct", "load_eval_set", "normalize"]

MATCH_MODES = ("exact", "contains")
DEFAULT_MAX_TOKENS = 32
MAX_TOKENS_LIMIT = 4096
_FIELDS = ("id", "prompt", "answer", "accept", "match", "max_tokens")
_EDGES = "\"'`*_ "
_TRAILING = ".,;:!?"


@dataclass(frozen=True, slots=True)
class EvalItem:
    """One question and what counts as a correct reply to it."""

    id: str
    prompt: str
    answer: str
    accept: tuple[str, ...] = ()
    match: str = "exact"
    max_tokens: int = DEFAULT_MAX_TOKENS

    @property
    def answers(self) -> tuple[str, ...]:
        return (self.answer, *self.accept)


def default_eval_path() -> Path:
    """The eval set shipped with loadgen (``loadgen/evals/default.jsonl``)."""
    return Path(str(resources.files("loadgen") / "evals" / "default.jsonl"))


def normalize(text: str) -> str:
    """``text`` as answers are compared: NFKC, case folded, whitespace collapsed, edges trimmed."""
    t = " ".join(unicodedata.normalize("NFKC", text).casefold().split())
    while True:
        trimmed = t.strip(_EDGES).rstrip(_TRAILING)
        if trimmed == t:
            return t
        t = trimmed


def is_correct(item: EvalItem, reply: str) -> bool:
    """Whether ``reply`` answers ``item`` correctly under its ``match`` mode (after ``normalize``)."""
    got = normalize(reply)
    wanted = [normalize(a) for a in item.answers]
    if item.match == "contains":
        return any(re.search(rf"(?<!\w){re.escape(w)}(?!\w)", got) for w in wanted if w)
    return got in wanted


def load_eval_set(path: str | Path | None = None) -> list[EvalItem]:
    """The items of the eval file at ``path`` (default: the shipped set).

    A problem is a one-line ``UserError`` naming the file, the line and the field.
    """
    p = Path(path) if path is not None else default_eval_path()
    try:
        lines = p.read_text("utf-8").splitlines()
    except FileNotFoundError:
        raise UserError(f"eval file {p}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"eval file {p}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    items: list[EvalItem] = []
    seen: dict[str, int] = {}
    for n, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        item = _item(p, n, line)
        if item.id in seen:
            raise UserError(f"{p} line {n}: id '{item.id}' is already used on line {seen[item.id]}; ids must be unique")
        seen[item.id] = n
        items.append(item)
    if not items:
        raise UserError(f"eval file {p}: no items; write one {{\"prompt\", \"answer\"}} object a line")
    return items


def _item(p: Path, n: int, line: str) -> EvalItem:
    where = f"{p} line {n}"
    try:
        obj: Any = orjson.loads(line)
    except orjson.JSONDecodeError:
        raise UserError(f"{where}: not JSON; write one {{\"prompt\", \"answer\"}} object a line") from None
    if not isinstance(obj, dict):
        raise UserError(f"{where}: not a JSON object; write one {{\"prompt\", \"answer\"}} object a line")
    unknown = sorted(set(obj) - set(_FIELDS))
    if unknown:
        raise UserError(f"{where}: unknown field '{unknown[0]}'; fields are {', '.join(_FIELDS)}")

    def text(field: str, required: bool) -> str | None:
        value = obj.get(field)
        if value is None and not required:
            return None
        if not isinstance(value, str) or not value.strip():
            raise UserError(f"{where}: field '{field}' must be a non-empty string")
        return value.strip()

    accept = obj.get("accept", [])
    if not isinstance(accept, list) or not all(isinstance(a, str) and a.strip() for a in accept):
        raise UserError(f"{where}: field 'accept' must be a list of non-empty strings")
    match = obj.get("match", "exact")
    if match not in MATCH_MODES:
        raise UserError(f"{where}: field 'match' is {match!r}; use one of {', '.join(MATCH_MODES)}")
    max_tokens = obj.get("max_tokens", DEFAULT_MAX_TOKENS)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 1 <= max_tokens <= MAX_TOKENS_LIMIT:
        raise UserError(f"{where}: field 'max_tokens' must be a whole number from 1 to {MAX_TOKENS_LIMIT}")
    return EvalItem(
        id=text("id", False) or f"line-{n}",
        prompt=text("prompt", True) or "",
        answer=text("answer", True) or "",
        accept=tuple(a.strip() for a in accept),
        match=match,
        max_tokens=max_tokens,
    )
