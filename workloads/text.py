"""Where prompt text comes from: a tokenizer that counts tokens and builds text of exact lengths.

Two kinds implement :class:`TextTokenizer`:

* :data:`BUILTIN`, loadgen's approximate tokenizer (``workloads.tokenizer``), shared with the
  simulated engine: a text built for N tokens is exactly N tokens to the sim;
* ``workloads.hf_tokenizer.HFTokenizer``, a Hugging Face ``tokenizers`` tokenizer, for exact
  lengths against a real model (``--tokenizer``).

Workloads build every synthetic text through one of these, so a run's prompt sizes are exact for
the tokenizer it names in run.json.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from typing import Any

from workloads.tokenizer import VOCABULARY, count_tokens


class TextTokenizer(ABC):
    """Counts tokens and builds texts of an exact token count from single-token words."""

    name: str
    kind: str

    @abstractmethod
    def count(self, text: str) -> int:
        """Tokens in ``text`` (no special tokens, no chat template)."""

    @property
    @abstractmethod
    def words(self) -> tuple[str, ...]:
        """Words that are one token each, also after a space, and never merge across a space."""

    def text(self, n_tokens: int, rng: random.Random) -> str:
        """Text of ``n_tokens`` tokens: ``n_tokens`` draws of :attr:`words` joined by single spaces."""
        if n_tokens <= 0:
            return ""
        return " ".join(rng.choices(self.words, k=n_tokens))

    def describe(self) -> dict[str, Any]:
        """What run.json records about this tokenizer."""
        return {"name": self.name, "kind": self.kind}


class BuiltinTokenizer(TextTokenizer):
    """loadgen's approximate tokenizer: word pieces of up to 8 characters and punctuation."""

    name = "builtin"
    kind = "approximate"

    def count(self, text: str) -> int:
        return count_tokens(text)

    @property
    def words(self) -> tuple[str, ...]:
        return VOCABULARY


BUILTIN = BuiltinTokenizer()
