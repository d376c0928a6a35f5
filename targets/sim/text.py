"""What the simulated model says: a deterministic reply for a given (seed, prompt).

Each generated token is one word of the shared tokenizer's ``VOCABULARY``, streamed as ``" word"``.
Under ``workloads.tokenizer`` a vocabulary word is exactly one token and whitespace is none, so a
reply of N words is N tokens to the client too, and the token ids the engine caches for the reply
are exactly those the next turn's prompt will contain.
"""

from __future__ import annotations

import hashlib
import random
from array import array
from collections.abc import Sequence

from workloads.tokenizer import VOCABULARY, token_ids

WORDS: tuple[str, ...] = VOCABULARY
WORD_TOKEN_IDS: tuple[int, ...] = tuple(token_ids(w)[0] for w in WORDS)
assert all(len(token_ids(w)) == 1 for w in WORDS)


def reply_words(seed: int, prompt_ids: Sequence[int], n: int) -> list[int]:
    """Indices into ``WORDS`` of the first ``n`` reply tokens for this prompt.

    Depends only on ``seed`` and the prompt's token ids; a longer reply extends a shorter one.
    """
    digest = hashlib.blake2b(array("I", prompt_ids).tobytes(), digest_size=8).digest()
    rng = random.Random((int(seed) << 64) | int.from_bytes(digest, "little"))
    return rng.choices(range(len(WORDS)), k=n)


def reply_text(seed: int, prompt_ids: Sequence[int], n: int) -> str:
    """The reply as the client assembles it from the streamed deltas (a leading space per word)."""
    return "".join(" " + WORDS[i] for i in reply_words(seed, prompt_ids, n))
