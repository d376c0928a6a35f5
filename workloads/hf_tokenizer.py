"""Exact token counts with a Hugging Face ``tokenizers`` tokenizer (``--tokenizer NAME_OR_PATH``).

``NAME_OR_PATH`` is a ``tokenizer.json`` file, a directory that holds one (a model or tokenizer
checkout), or the name of a model already in the local Hugging Face cache
(``$HF_HOME/hub/models--ORG--NAME``). Nothing is downloaded.

Prompts are built from loadgen's vocabulary words that are one token each for this tokenizer, with
and without a leading space, so a text of N words is N tokens; every text is checked and, where
the tokenizer merges across words after all, trimmed or padded until it is exact.
"""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path
from typing import Any

from workloads.errors import WorkloadError
from workloads.text import TextTokenizer
from workloads.tokenizer import VOCABULARY

INSTALL_HINT = "pip install 'loadgen[tokenizers]' (the tokenizers package)"
_FIX_ROUNDS = 8


class HFTokenizer(TextTokenizer):
    """A ``tokenizers.Tokenizer`` with loadgen's text interface."""

    kind = "huggingface"

    def __init__(self, tokenizer: Any, *, name: str, path: str, sha256: str) -> None:
        self._tok = tokenizer
        self.name = name
        self.path = path
        self.sha256 = sha256
        self._words = self._single_token_words()
        if not self._words:
            raise WorkloadError(
                f"--tokenizer {name}: none of loadgen's prompt words is a single token for it; "
                "use the tokenizer of a word-level or BPE model"
            )

    def count(self, text: str) -> int:
        if not text:
            return 0
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    @property
    def words(self) -> tuple[str, ...]:
        return self._words

    def _single_token_words(self) -> tuple[str, ...]:
        base = self.count("the")
        out = []
        for w in VOCABULARY:
            # One token alone (first word of a text) and one more after a word and a space.
            if self.count(w) == 1 and self.count("the " + w) == base + 1:
                out.append(w)
        return tuple(out)

    def text(self, n_tokens: int, rng: random.Random) -> str:
        if n_tokens <= 0:
            return ""
        words = rng.choices(self._words, k=n_tokens)
        for _ in range(_FIX_ROUNDS):
            got = self.count(" ".join(words))
            if got == n_tokens:
                break
            if got > n_tokens:
                del words[max(1, len(words) - (got - n_tokens)) :]
            else:
                words.extend(rng.choices(self._words, k=n_tokens - got))
        return " ".join(words)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "path": self.path,
            "sha256": self.sha256,
            "vocab_size": self._tok.get_vocab_size(),
        }


def resolve_tokenizer_file(name_or_path: str) -> Path:
    """The ``tokenizer.json`` that ``name_or_path`` means; a one-line error when there is none."""
    p = Path(name_or_path).expanduser()
    if p.is_file():
        return p
    if p.is_dir():
        f = p / "tokenizer.json"
        if f.is_file():
            return f
        raise WorkloadError(f"--tokenizer {name_or_path}: the directory holds no tokenizer.json")
    if "/" in name_or_path and not name_or_path.startswith((".", "/")):
        cached = _hf_cache_file(name_or_path)
        if cached is not None:
            return cached
    raise WorkloadError(
        f"--tokenizer {name_or_path}: no such file or directory, and no model of that name in the local "
        "Hugging Face cache; give a tokenizer.json, a directory holding one, or an ORG/NAME already cached"
    )


def _hf_cache_file(repo_id: str) -> Path | None:
    home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    hub = Path(os.environ.get("HF_HUB_CACHE", home / "hub"))
    root = hub / ("models--" + repo_id.replace("/", "--"))
    ref = root / "refs" / "main"
    if ref.is_file():
        f = root / "snapshots" / ref.read_text().strip() / "tokenizer.json"
        if f.is_file():
            return f
    found = sorted((root / "snapshots").glob("*/tokenizer.json"))
    return found[-1] if found else None


def load_hf_tokenizer(name_or_path: str, *, json_text: str | None = None) -> HFTokenizer:
    """Load ``name_or_path`` (or, on a worker without the file, the master's ``json_text``)."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise WorkloadError(f"--tokenizer needs the tokenizers package; {INSTALL_HINT}") from None
    if json_text is None:
        path = resolve_tokenizer_file(name_or_path)
        try:
            json_text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise WorkloadError(f"--tokenizer {name_or_path}: cannot read {path} ({e})") from None
        shown = str(path)
    else:
        shown = name_or_path
    try:
        tok = Tokenizer.from_str(json_text)
    except Exception as e:  # the library raises its own exception types for bad JSON or schema
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise WorkloadError(f"--tokenizer {name_or_path}: not a tokenizers tokenizer.json ({first[:100]})") from None
    digest = hashlib.sha256(json_text.encode("utf-8")).hexdigest()
    return HFTokenizer(tok, name=name_or_path, path=shown, sha256=digest)
