"""Sessions' prompts as block requests in arrival order, fed to the prefix-cache reuse model.

Each step of a session sends a prompt: the system prompt, the context it extends (earlier
messages and the replies, as long as ``max_tokens`` asks) and its own message. Cut into blocks of
``block_size`` tokens, as a vLLM-style prefix cache does, that prompt is

* a **head** of shareable blocks: the system prompt and, when it is shareable (a text, a trace's
  prefix blocks), the first message; named by a hash chain over the pieces each block holds, so
  two sessions share a block only when they share everything before it too;
* then the session's **private** blocks, from the first block holding tokens no other session
  sends (its own synthetic text, a reply) on: one group per step (:class:`workloads.reuse.Group`),
  holding the full blocks the step adds (its message tail and its reply).

A head's last block, when partial, is looked up and counts as the tokens it holds (a trace's
partial last block is a prefix of the whole block of that id). A ``cold`` step (a nonce at the
start of its prompt) hits nothing, and later steps hit only up to its context.

Steps are taken in arrival order: session k arrives at its offset, a step at its parents' time
plus its think time (replies take no time here: the order is what a fast server would see).
Without arrival times, sessions are taken one after another. Sessions must come in arrival order.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Sequence
from typing import Any

from workloads.model import STEP_JOIN
from workloads.reuse import Group, ReuseCounter, ReuseCurve
from workloads.shapes import Piece, SessionShape, context_parent

_HEAD_MEMO = 4096  # heads kept by their pieces: a tenant's system prompt is cut once


class SessionReuse:
    """Feed sessions (in arrival order) with :meth:`add`; :meth:`curve` gives the reuse."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.counter = ReuseCounter(block_size)
        self._pending: list[tuple[float, int, int, tuple[Any, ...]]] = []
        self._heads: dict[tuple[Piece, ...], list[tuple[Hashable, int]]] = {}

    def add(self, shape: SessionShape, arrival_s: float | None) -> None:
        """Session ``shape`` arriving at ``arrival_s`` (None: after every earlier session's steps)."""
        B = self.block_size
        turns = shape.turns
        pending = self._pending
        if arrival_s is not None:
            while pending and pending[0][0] <= arrival_s:
                self._send(heapq.heappop(pending)[3])
        if len(turns) == 1 and not shape.system and turns[0].pieces is None:
            self.counter.request((), (), turns[0].tokens, None, (turns[0].tokens + turns[0].max_tokens) // B)
            return
        requests = self._requests(shape, arrival_s or 0.0)
        if arrival_s is None:
            for _, _, _, req in sorted(requests, key=lambda r: (r[0], r[2])):
                self._send(req)
            return
        for r in requests:
            heapq.heappush(pending, r)
        while pending and pending[0][0] <= arrival_s:
            self._send(heapq.heappop(pending)[3])

    def add_one(self, tokens: int, max_tokens: int, arrival_s: float | None) -> None:
        """A one-turn session of its own text and no system prompt (an Azure or BurstGPT row): it
        can hit nothing and nothing hits it, so it only ages what is cached."""
        pending = self._pending
        if arrival_s is not None:
            while pending and pending[0][0] <= arrival_s:
                self._send(heapq.heappop(pending)[3])
        self.counter.add_private(tokens, (tokens + max_tokens) // self.block_size)

    def curve(self) -> ReuseCurve:
        """Sends every step still pending, then the reuse of all requests so far."""
        while self._pending:
            self._send(heapq.heappop(self._pending)[3])
        return self.counter.curve()

    def _send(self, req: tuple[Any, ...]) -> None:
        self.counter.request(*req)

    def _requests(self, shape: SessionShape, t0: float) -> list[tuple[float, int, int, tuple[Any, ...]]]:
        B = self.block_size
        turns = shape.turns
        root = turns[0]
        if root.pieces is not None and not root.cold:
            head_pieces, head_tokens = shape.system + root.pieces, shape.system_tokens + root.tokens
            head = head_blocks(head_pieces, B)  # full blocks, then a partial last one if any
        else:  # the system prompt alone: the same for many sessions, cut once
            head_pieces, head_tokens = shape.system, shape.system_tokens
            head = self._head(head_pieces)
        full_head = head if head_tokens % B == 0 else head[:-1]
        root_whole = root.pieces is not None  # the root's prompt is all head
        referenced = {cp for i in range(len(turns)) if (cp := context_parent(shape, i)) is not None}
        context: list[int] = []  # tokens after each step's reply
        times: list[float] = []
        paths: list[tuple[Group, ...]] = []
        groups: list[Group] = []
        out = []
        for i, t in enumerate(turns):
            cp = context_parent(shape, i)
            if cp is None:
                start, own = 0, shape.system_tokens + t.tokens
                first_block = head_tokens // B
                shared = head if root_whole else full_head
                path: tuple[Group, ...] = ()
            else:
                start = context[cp]
                own = t.tokens + (sum(turns[p].max_tokens for p in t.parents) if t.kind == STEP_JOIN else 0)
                first_block = start // B
                shared = full_head
                path = paths[cp] + (groups[cp],)
            prompt = start + own
            end = prompt + t.max_tokens
            context.append(end)
            times.append(t0 if not t.parents else max(times[p] for p in t.parents) + t.think_time_s)
            group = Group(("g", shape.index, i), max(0, end // B - first_block))
            groups.append(group)
            paths.append(path)
            if t.cold:
                req: tuple[Any, ...] = ((), (), prompt, None, end // B)
            else:
                req = (shared, path, prompt, group if i in referenced else None, group.blocks)
            out.append((times[i], shape.index, i, req))
        return out

    def _head(self, pieces: tuple[Piece, ...]) -> list[tuple[Hashable, int]]:
        head = self._heads.get(pieces)
        if head is None:
            head = head_blocks(pieces, self.block_size)
            if len(self._heads) >= _HEAD_MEMO:
                self._heads.clear()
            self._heads[pieces] = head
        return head


def head_blocks(pieces: Sequence[Piece], block_size: int) -> list[tuple[Hashable, int]]:
    """``(key, tokens)`` of each block of a run of shareable pieces: full blocks, then the partial
    last one if any. A block's key is a hash chain over its parent's key and the pieces it holds
    (key and offset of each, and the token count of all but the last, whose count a partial
    block leaves open): two blocks match only when their whole prefixes do."""
    out: list[tuple[Hashable, int]] = []
    parent: int = 0
    inside: list[tuple[Any, ...]] = []
    filled = 0
    for key, n in pieces:
        if not filled and n == block_size:  # a trace's whole block: the usual case, kept short
            parent = hash((parent, (key, 0)))
            out.append((parent, block_size))
            continue
        offset = 0
        while offset < n:
            take = min(n - offset, block_size - filled)
            inside.append((key, offset, take))
            offset += take
            filled += take
            if filled == block_size:
                parent = _chain(parent, inside)
                out.append((parent, block_size))
                inside, filled = [], 0
    if filled:
        out.append((_chain(parent, inside), filled))
    return out


def _chain(parent: int, inside: list[tuple[Any, ...]]) -> int:
    last_key, last_offset, _ = inside[-1]
    return hash((parent, *inside[:-1], (last_key, last_offset)))
