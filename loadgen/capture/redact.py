"""Same-shape filler for captured text, so production traffic can be shared.

Every run of word characters becomes a common English word of the same length (runs longer than 8
become 8-letter words run together, then one for the rest), every other non-space character
becomes ``.``, and whitespace and the chat template's role markers (``<|user|>``) stay. Under
loadgen's tokenizer (``workloads.tokenizer``: role markers, runs of up to 8 word characters,
single punctuation) the filler has exactly as many tokens and characters as the text it
replaces: a run keeps its length, so it splits into as many 8-character pieces, and punctuation
stays one token each. Real words rather than ``xxxx`` keep a model's own tokenizer close too
(a common word is about one token there, a run of ``x`` several).

What survives is the shape: lengths of words and lines, where punctuation sits, and which texts
are identical (identical texts give identical filler, so shared prompt prefixes stay shared).
"""

from __future__ import annotations

import re

_PIECE_RE = re.compile(r"(?P<marker><\|[a-z_]+\|>)|(?P<word>\w+)|[^\w\s]")
# One common word per length, 1 to 8 characters (8 is the tokenizer's longest word piece).
_WORDS = ("", "a", "of", "the", "data", "value", "server", "request", "function")
_LONGEST = len(_WORDS) - 1


def _filler(m: re.Match[str]) -> str:
    if m.group("marker"):
        return m.group()
    if m.group("word"):
        n = len(m.group())
        return _WORDS[_LONGEST] * (n // _LONGEST) + _WORDS[n % _LONGEST]
    return "."


def redact(text: str) -> str:
    """``text`` with its content replaced by filler of the same length and token count."""
    return _PIECE_RE.sub(_filler, text)
