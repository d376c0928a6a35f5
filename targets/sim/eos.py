"""Where a reply ends: at ``max_tokens`` (``length``), or earlier at a drawn end of sequence (``stop``).

A profile's ``eos_lengths`` is a distribution of natural reply lengths in tokens (the workload
distributions' forms, ``workloads.distributions``: e.g. ``{dist: lognormal, median: 120, sigma:
0.8}``). Each reply draws one length L >= 1 from a generator seeded by (seed, prompt token ids),
as the reply's words are, so the same conversation ends at the same token in every run whatever
the arrival order. L <= max_tokens: the reply has L tokens and ends with ``stop``; otherwise it has
max_tokens and ends with ``length``. Without ``eos_lengths``, or when the request asks for
``ignore_eos`` (vLLM's extension), every reply runs to max_tokens.
"""

from __future__ import annotations

import hashlib
import random
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from workloads.distributions import Distribution

STOP = "stop"
LENGTH = "length"


@dataclass(frozen=True, slots=True)
class ReplyEnd:
    """How long a reply is and why it ends; ``drawn`` is the length drawn (None without one)."""

    tokens: int
    finish_reason: str  # STOP | LENGTH
    drawn: int | None = None


def reply_end(
    eos_lengths: Distribution | None, seed: int, prompt_ids: Sequence[int], max_tokens: int, ignore_eos: bool
) -> ReplyEnd:
    """The end of a reply of at most ``max_tokens`` tokens to ``prompt_ids`` (module docstring)."""
    if eos_lengths is None or ignore_eos:
        return ReplyEnd(max_tokens, LENGTH)
    digest = hashlib.blake2b(b"eos" + array("I", prompt_ids).tobytes(), digest_size=8).digest()
    rng = random.Random((int(seed) << 64) | int.from_bytes(digest, "little"))
    drawn = max(1, int(eos_lengths.sample(rng)))
    if drawn <= max_tokens:
        return ReplyEnd(drawn, STOP, drawn)
    return ReplyEnd(max_tokens, LENGTH, drawn)
