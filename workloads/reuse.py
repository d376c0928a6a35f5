"""Prefix-cache reuse of a request stream, and the LRU cache size that realises it.

The cache is a vLLM-style block cache: a prompt is cut into blocks of ``block_size`` tokens, a block
is named by its whole prefix (a hash chain), and a request hits on its leading blocks that are
cached. :class:`ReuseCounter` takes requests in arrival order and, in one pass, gives the hit rate
of an LRU cache of *every* capacity (Mattson's stack algorithm): a block hits in an LRU of C blocks
exactly when fewer than C distinct blocks were touched since it was last touched (its *stack
distance*). Because a request touching block i+1 of a chain also touched block i, the head of a
prompt is always more recent than its tail, so the blocks that hit in a cache of C blocks are a
leading run of the prompt, as a prefix cache needs. At infinite capacity the hit rate is the
theoretical prefix reuse.

A request touches two kinds of blocks:

* **shared blocks**, named by a key (their hash chain), which any later request may hit;
* **private groups**: a run of full blocks only one session's later steps can reach (its
  history: unique prompt text and the replies). A group is one entry of ``n`` blocks, so a
  10k-token private history costs one update, not 600. A group no later step extends (a
  single-turn trace row, a session's last step) is never looked up again: it only counts as
  ``n`` more recently touched blocks for everything older, an O(1) add. That is what keeps a
  10M-row trace without shared prefixes at a few microseconds a row.

Within one request the tail is touched first and the head last (vLLM and the sim unpin a finished
sequence tail first), so the shared head of a prompt is evicted last. What this leaves out: the
blocks running requests pin (the cache here holds only what finished requests left), and the
engine's chat template tokens.
"""

from __future__ import annotations

from array import array
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np


class _Fenwick:
    """Prefix sums over positions 1..n of non-negative weights; n doubles as positions are added.

    An int64 array (8 bytes a position: a trace touches tens of millions). With n a power of two,
    growing to 2n costs O(1): of the new nodes only node 2n covers old positions, and it holds
    their total.
    """

    __slots__ = ("_tree",)

    def __init__(self, size: int = 1024) -> None:
        if size < 1 or size & (size - 1):
            raise ValueError("size must be a power of two")
        self._tree = array("q", bytes(8 * (size + 1)))

    def add(self, pos: int, delta: int) -> None:
        tree = self._tree
        while pos >= len(tree):
            size = len(tree) - 1
            total = self.prefix(size)
            tree.extend(array("q", bytes(8 * size)))
            tree[2 * size] = total
        n = len(tree)
        while pos < n:
            tree[pos] += delta
            pos += pos & -pos

    def prefix(self, pos: int) -> int:
        """Sum of the weights at positions 1..pos."""
        tree = self._tree
        pos = min(pos, len(tree) - 1)
        total = 0
        while pos > 0:
            total += tree[pos]
            pos -= pos & -pos
        return total


class _ChainGroup:
    """The shared blocks one request touched last: one entry at one position, ranked head first."""

    __slots__ = ("blocks", "permanent_then", "pos", "removed", "weight")

    def __init__(self, pos: int, permanent_then: int, blocks: int) -> None:
        self.pos = pos
        self.permanent_then = permanent_then
        self.blocks = blocks
        self.removed = 0  # its leading blocks a later request took (always a prefix)
        self.weight = blocks  # blocks still here: its weight in the recency index


@dataclass(frozen=True, slots=True)
class Group:
    """A session's private run of full blocks: its id and how many blocks it holds."""

    group_id: Hashable
    blocks: int


class ReuseCounter:
    """Stack distances of the blocks requests hit, over a stream of requests in arrival order.

    Call :meth:`request` once per request; then :meth:`curve` gives the hit rate at each
    capacity. Units: blocks of ``block_size`` tokens; hits and totals in tokens.
    """

    def __init__(self, block_size: int) -> None:
        if block_size < 1:
            raise ValueError("block_size must be >= 1")
        self.block_size = block_size
        self.requests = 0
        self.prompt_tokens = 0
        self.unique_shared_blocks = 0
        self._tree = _Fenwick()
        self._live = 0  # weight in the tree
        self._next_pos = 1
        self._permanent = 0  # blocks of groups never looked up again, touched so far
        self._where: dict[Hashable, tuple[int, int, int]] = {}  # group id -> (pos, permanent then, blocks)
        self._chains: dict[Hashable, tuple[_ChainGroup, int]] = {}  # shared block key -> (chain group, rank)
        # Every hit-able run of blocks: distance of its first block, blocks, tokens per block.
        self._dist = array("q")
        self._count = array("q")
        self._tokens = array("q")

    def request(
        self,
        shared: Sequence[tuple[Hashable, int]],
        ancestors: Sequence[Group],
        prompt_tokens: int,
        new: Group | None,
        new_blocks: int,
    ) -> None:
        """One request, in arrival order.

        ``shared``: its leading shareable blocks, ``(key, tokens)`` each (the last may hold fewer
        than ``block_size`` tokens). ``ancestors``: the private groups of its session's context
        before its own tokens, root first. ``prompt_tokens``: the whole prompt. ``new``: the group
        of full blocks it adds after them (prompt tail and reply), or None when no later step
        extends it; ``new_blocks`` is that group's size either way.
        """
        self.requests += 1
        self.prompt_tokens += prompt_tokens
        chains = self._chains
        B = self.block_size
        # Look up first (before this request's own touches), head to tail; a miss ends the hits.
        chain_whole = True
        run: _ChainGroup | None = None  # the chain group of the run of hits being recorded
        run_dist = run_count = 0
        for key, n in shared:
            at = chains.get(key)
            if at is None:
                chain_whole = False
                break
            group, rank = at
            if group is not run or n != B:
                if run_count:
                    self._record(run_dist, run_count, B)
                run, run_count = group, 0
                run_dist = self._count_after(group.pos, group.permanent_then) + rank - group.removed
                if n != B:  # a partial last block: a run of its own
                    self._record(run_dist, 1, n)
                    run = None
                    continue
            run_count += 1
        if run_count:
            self._record(run_dist, run_count, B)
        if chain_whole:
            where = self._where
            for g in ancestors:
                at2 = where.get(g.group_id)
                if at2 is None:
                    break
                self._record(self._count_after(at2[0], at2[1]), g.blocks, B)
        # Then touch, tail first: the new group, the ancestors leaf to root, the shared chain.
        if new is None:
            self._permanent += new_blocks
        else:
            self._touch(new.group_id, new.blocks)
        for g in reversed(ancestors):
            self._touch(g.group_id, g.blocks)
        if shared:
            self._touch_chain(shared)

    def _touch_chain(self, shared: Sequence[tuple[Hashable, int]]) -> None:
        # A chain's blocks become one group at one position, ranked head first (block 0 the most
        # recent). A later request touching block i of a chain touches blocks 0..i-1 too, so it
        # takes a *prefix* of every group it touches: ``removed`` of a group's blocks have left
        # it, and a block of rank r still in it has r - removed of the group above it.
        chains = self._chains
        tree = self._tree
        touched: dict[int, _ChainGroup] = {}
        for key, _ in shared:
            at = chains.get(key)
            if at is None:
                self.unique_shared_blocks += 1
            else:
                at[0].removed += 1
                touched[id(at[0])] = at[0]
        for old in touched.values():
            delta = (old.blocks - old.removed) - old.weight  # its blocks that left it
            tree.add(old.pos, delta)
            self._live += delta
            old.weight += delta
        group = _ChainGroup(self._next_pos, self._permanent, len(shared))
        self._next_pos += 1
        tree.add(group.pos, group.blocks)
        self._live += group.blocks
        for rank, (key, _) in enumerate(shared):
            chains[key] = (group, rank)

    def add_private(self, prompt_tokens: int, blocks: int) -> None:
        """A request that shares nothing and that nothing extends: ``request((), (), prompt_tokens,
        None, blocks)`` at a fraction of the cost."""
        self.requests += 1
        self.prompt_tokens += prompt_tokens
        self._permanent += blocks

    def _count_after(self, pos: int, permanent_then: int) -> int:
        """Blocks touched since position ``pos`` was (their distinct count: the stack distance)."""
        return (self._live - self._tree.prefix(pos)) + (self._permanent - permanent_then)

    def _record(self, dist: int, count: int, tokens: int) -> None:
        self._dist.append(dist)
        self._count.append(count)
        self._tokens.append(tokens)

    def _touch(self, key: Hashable, blocks: int) -> None:
        old = self._where.get(key)
        if old is not None:
            self._tree.add(old[0], -old[2])
            self._live -= old[2]
        pos = self._next_pos
        self._next_pos += 1
        self._tree.add(pos, blocks)
        self._live += blocks
        self._where[key] = (pos, self._permanent, blocks)

    def curve(self) -> ReuseCurve:
        """The hit rate as a function of capacity, for the requests seen so far."""
        return ReuseCurve(
            block_size=self.block_size,
            prompt_tokens=self.prompt_tokens,
            unique_shared_blocks=self.unique_shared_blocks,
            dist=np.frombuffer(self._dist, dtype=np.int64).copy(),
            count=np.frombuffer(self._count, dtype=np.int64).copy(),
            tokens=np.frombuffer(self._tokens, dtype=np.int64).copy(),
        )


@dataclass(frozen=True)
class ReuseCurve:
    """Hit tokens of an LRU cache as a function of its capacity (blocks), from stack distances.

    A run ``(d, n, t)`` is ``n`` blocks of ``t`` tokens at distances ``d, d+1, ..., d+n-1``: in a
    cache of ``C`` blocks, ``clip(C - d, 0, n)`` of them hit.
    """

    block_size: int
    prompt_tokens: int
    unique_shared_blocks: int  # distinct shareable blocks sent (a trace's unique hash ids, at its block size)
    dist: np.ndarray
    count: np.ndarray
    tokens: np.ndarray

    def hit_tokens(self, capacity_blocks: int | None) -> int:
        """Prompt tokens served from an LRU cache of ``capacity_blocks`` (None: unbounded)."""
        if capacity_blocks is None:
            return int((self.count * self.tokens).sum())
        hits = np.clip(capacity_blocks - self.dist, 0, self.count)
        return int((hits * self.tokens).sum())

    def hit_rate(self, capacity_blocks: int | None) -> float:
        """Share of prompt tokens served from the cache, 0..1 (0 for no prompt tokens)."""
        return self.hit_tokens(capacity_blocks) / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def working_set_blocks(self) -> int:
        """The smallest capacity that realises all of the reuse (0 when nothing is reused)."""
        return int((self.dist + self.count).max()) if len(self.dist) else 0

    def capacity_for(self, share: float) -> int:
        """The smallest capacity (blocks) whose hits are at least ``share`` (0..1] of the unbounded
        cache's; 0 when nothing is reused."""
        want = share * self.hit_tokens(None)
        if want <= 0:
            return 0
        lo, hi = 1, self.working_set_blocks
        while lo < hi:  # hit_tokens grows with the capacity
            mid = (lo + hi) // 2
            if self.hit_tokens(mid) >= want:
                hi = mid
            else:
                lo = mid + 1
        return lo
