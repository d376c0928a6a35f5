"""Prompt text built from prefix blocks (a trace's ``hash_ids``), shared by traces and session files.

Block b's words depend only on (seed, b) and the tokenizer's word list, and a block cut short is a
prefix of the whole block. So requests (or session-file turns) that share leading block ids share
the same prompt prefix, whichever file they were read from: a Mooncake trace and its counts-only
export send the very same prompts under one seed.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Iterable

from workloads.text import TextTokenizer

_BLOCK_CACHE = 4096  # blocks kept as word lists; a trace reuses recent blocks most


class BlockTexts:
    """Block texts of one workload: ``text(seed, [[block_id, n_tokens], ...], block_size)``."""

    def __init__(self) -> None:
        self._blocks: OrderedDict[tuple[int, int, int, int], list[str]] = OrderedDict()

    def text(self, seed: int, blocks: Iterable[tuple[int, int] | list[int]], block_size: int, tokenizer: TextTokenizer) -> str:
        words: list[str] = []
        for block_id, n in blocks:
            words.extend(self.words(seed, block_id, block_size, tokenizer)[:n])
        return " ".join(words)

    def words(self, seed: int, block_id: int, block_size: int, tokenizer: TextTokenizer) -> list[str]:
        key = (seed, block_id, block_size, id(tokenizer))
        words = self._blocks.get(key)
        if words is None:
            words = random.Random(f"{seed}:block:{block_id}").choices(tokenizer.words, k=block_size)
            self._blocks[key] = words
            if len(self._blocks) > _BLOCK_CACHE:
                self._blocks.popitem(last=False)
        else:
            self._blocks.move_to_end(key)
        return words


def split_blocks(ids: list[int], n_tokens: int, block_size: int) -> list[list[int]]:
    """``[[id, tokens], ...]``: every block whole but the last, which holds what is left of ``n_tokens``."""
    blocks = [[b, block_size] for b in ids]
    if blocks:
        blocks[-1][1] = n_tokens - block_size * (len(ids) - 1)
    return blocks


def blocks_needed(n_tokens: int, block_size: int) -> int:
    return -(-n_tokens // block_size)
