"""Known answers: the sim replies to a known question with its answer instead of filler words.

So a quality check can run against the sim and pass or fail on purpose. An answers file is JSONL,
one ``{"prompt": "...", "answer": "..."}`` object a line (other fields are ignored, so a quality
eval file is an answers file too; blank lines and ``#`` comments are skipped). A request's question
is the content of its last user message (chat) or, for completions, the last user block of the
shared chat template (``<|user|>\\n...\\n``), else the whole prompt; leading and trailing
whitespace does not count. With ``wrong`` every known question gets ``WRONG_ANSWER`` instead.

The reply streams one chunk per whitespace-separated word of the answer (a word carries the
whitespace before it), ends with ``finish_reason: "stop"``, and is cut at ``max_tokens`` chunks
(then ``"length"``). Timing follows the engine model for that many tokens. The engine's prefix
cache still holds the filler words' ids for the reply: a follow-up turn that quotes an answer
gets fewer cache hits than it would on a real engine.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

__all__ = ["WRONG_ANSWER", "AnswersError", "answer_pieces", "load_answers", "question_of", "reply_pieces"]

WRONG_ANSWER = "I do not know."
_USER_BLOCK = re.compile(r"<\|user\|>\n(.*?)\n(?=<\|[a-z_]+\|>|\Z)", re.S)
_WORD = re.compile(r"\s*\S+")


class AnswersError(ValueError):
    """An answers file that cannot be used; ``str()`` names the file, the line and the fix."""


def load_answers(path: str | Path) -> dict[str, str]:
    """question -> answer from the JSONL file at ``path`` (see the module docstring)."""
    p = Path(path)
    try:
        lines = p.read_text("utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise AnswersError(f"answers file {p}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    out: dict[str, str] = {}
    for n, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            raise AnswersError(f"{p} line {n}: not a JSON object; write one {{\"prompt\", \"answer\"}} a line") from None
        if not isinstance(obj, dict):
            raise AnswersError(f"{p} line {n}: not a JSON object; write one {{\"prompt\", \"answer\"}} a line")
        for key in ("prompt", "answer"):
            value = obj.get(key)
            if not isinstance(value, str) or not value.strip():
                raise AnswersError(f"{p} line {n}: '{key}' must be a non-empty string")
        out[obj["prompt"].strip()] = obj["answer"].strip()
    return out


def question_of(endpoint_is_chat: bool, body: Any) -> str | None:
    """The question a request body asks (see the module docstring); None when it has none."""
    if not isinstance(body, dict):
        return None
    if endpoint_is_chat:
        messages = body.get("messages")
        if not isinstance(messages, list):
            return None
        for m in reversed(messages):
            if isinstance(m, dict) and m.get("role") == "user" and isinstance(m.get("content"), str):
                return m["content"].strip()
        return None
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        return None
    blocks = _USER_BLOCK.findall(prompt)
    return (blocks[-1] if blocks else prompt).strip()


def answer_pieces(answer: str) -> list[str]:
    """The streamed chunks of ``answer``: one per word, each with the whitespace before it."""
    return _WORD.findall(answer)


def reply_pieces(
    answers: Mapping[str, str] | None, wrong: bool, endpoint_is_chat: bool, body: Any
) -> list[str] | None:
    """The chunks the sim streams for ``body``: its answer's, or None for an unknown question."""
    if not answers:
        return None
    question = question_of(endpoint_is_chat, body)
    if question is None or question not in answers:
        return None
    return answer_pieces(WRONG_ANSWER if wrong else answers[question])
