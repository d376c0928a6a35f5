"""A block-level prefix cache over a fixed pool of KV blocks, as in vLLM's automatic prefix caching.

Token sequences are cut into blocks of ``block_size`` tokens. A full block is identified by a hash
chain: ``hash((parent_hash, *block_tokens))``, so a block matches only when the whole prefix before
it matches too. The pool has ``num_blocks`` blocks, split into

* cached blocks with a reference count: held by running sequences (pinned) or, at count 0, kept
  for reuse on an LRU list and evicted oldest-first when space is needed;
* private blocks: reserved by running sequences for tokens not (yet) in a full cached block.

Python's ``hash`` of a tuple of ints is not salted per process, so block hashes (and with them
cache behaviour) are the same in every run.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

ROOT_HASH = 0x51AB_CACE  # parent of a sequence's first block


def block_hash(parent: int, tokens: Sequence[int]) -> int:
    """The hash-chain id of one full block whose prefix hashes to ``parent``."""
    return hash((parent, *tokens))


def block_hashes(token_ids: Sequence[int], block_size: int) -> list[int]:
    """Hash-chain ids of every *full* block of ``token_ids`` (a trailing partial block has none)."""
    out: list[int] = []
    parent = ROOT_HASH
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash((parent, *token_ids[start : start + block_size]))
        out.append(parent)
    return out


class PrefixCache:
    """The KV block pool. All counts are in blocks; a block holds ``block_size`` tokens."""

    __slots__ = ("_evictable", "_refs", "block_size", "evictions", "num_blocks", "private_blocks")

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._refs: dict[int, int] = {}  # cached block hash -> reference count
        self._evictable: OrderedDict[int, None] = OrderedDict()  # refcount-0 blocks, oldest first
        self.private_blocks = 0
        self.evictions = 0

    # --- queries -----------------------------------------------------------------------------
    @property
    def cached_blocks(self) -> int:
        """Blocks holding a hashed prefix (pinned or evictable)."""
        return len(self._refs)

    @property
    def used_blocks(self) -> int:
        """Blocks held by running sequences (pinned cached + private); evictable ones are not used."""
        return self.private_blocks + len(self._refs) - len(self._evictable)

    @property
    def free_blocks(self) -> int:
        """Blocks in neither the cache nor any sequence's reservation."""
        return self.num_blocks - self.private_blocks - len(self._refs)

    def usage(self) -> float:
        """Share of the pool held by running sequences, 0..1 (vLLM's ``kv_cache_usage_perc``)."""
        return self.used_blocks / self.num_blocks

    def __contains__(self, h: int) -> bool:
        return h in self._refs

    def match(self, hashes: Sequence[int]) -> int:
        """How many leading blocks of ``hashes`` are cached (pinned or evictable)."""
        n = 0
        refs = self._refs
        for h in hashes:
            if h not in refs:
                break
            n += 1
        return n

    def can_reserve(self, hit_hashes: Sequence[int], n_private: int) -> bool:
        """Whether pinning ``hit_hashes`` and reserving ``n_private`` blocks fits the pool."""
        evictable_after_pin = len(self._evictable) - sum(1 for h in hit_hashes if h in self._evictable)
        return self.free_blocks + evictable_after_pin >= n_private

    # --- changes -----------------------------------------------------------------------------
    def reserve(self, hit_hashes: Sequence[int], n_private: int) -> bool:
        """Pin ``hit_hashes`` (cached blocks) and reserve ``n_private`` private blocks, evicting
        least-recently-used unpinned blocks if needed. Returns False, changing nothing, if it can't."""
        if not self.can_reserve(hit_hashes, n_private):
            return False
        for h in hit_hashes:
            self._pin(h)
        shortfall = n_private - self.free_blocks
        for _ in range(max(0, shortfall)):
            victim, _ = self._evictable.popitem(last=False)
            del self._refs[victim]
            self.evictions += 1
        self.private_blocks += n_private
        return True

    def commit(self, h: int) -> None:
        """A sequence filled one of its private blocks whose hash-chain id is ``h``: the block
        becomes a cached block pinned by that sequence. If another sequence already cached the
        same block, the sequence shares it and its private block returns to the pool."""
        self.private_blocks -= 1
        if h in self._refs:
            self._pin(h)
        else:
            self._refs[h] = 1

    def release(self, pinned: Sequence[int], n_private: int) -> None:
        """A sequence ended: unpin its cached blocks and return its unused private blocks.

        Blocks are unpinned tail first, so a conversation's tail is evicted before the shared
        head of its prompt (vLLM does the same).
        """
        self.private_blocks -= n_private
        refs = self._refs
        for h in reversed(pinned):
            left = refs[h] - 1
            refs[h] = left
            if left == 0:
                self._evictable[h] = None

    def _pin(self, h: int) -> None:
        count = self._refs[h]
        if count == 0:
            del self._evictable[h]
        self._refs[h] = count + 1
