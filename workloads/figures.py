"""One pass over a workload's sessions: the figures ``workload inspect`` and ``analyze`` print.

Sizes come from :mod:`workloads.shapes` (counts, no prompt text built where the format gives
counts), the prefix-cache reuse from :mod:`workloads.prompt_blocks` and :mod:`workloads.reuse`
(an LRU over the block-hash sequence in arrival order, every capacity at once). Everything covers
the same sessions ``0..n-1``.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Any

import numpy as np

from workloads.model import STEP_FAN_OUT_CHILD, STEP_FIRST
from workloads.prompt_blocks import SessionReuse
from workloads.reuse import ReuseCurve
from workloads.shapes import SessionShape, context_parent, session_shapes
from workloads.text import TextTokenizer
from workloads.workload import Workload

DEFAULT_BLOCK_SIZE = 16  # vLLM's and the sim's KV block, for workloads without a block size of their own
REUSE_SHARES = (0.5, 0.9, 0.99)


class ShapeFigures:
    """Accumulates the per-session and per-request distributions (compact arrays, not lists).

    One-turn sessions of their own text (a trace's rows) go to arrays of their own, merged by
    :meth:`finish`: at 10M rows, each append saved is a second.
    """

    def __init__(self) -> None:
        self.turns_per = array("q")
        self.first_in = array("q")
        self.follow_in = array("q")
        self.outputs = array("q")
        self.context = array("q")
        self.prompts = array("q")  # every request's whole prompt, replies as long as asked
        self.thinks = array("d")
        self.fan_out = array("q")  # children per fan-out
        self.roles: dict[str, int] = {}
        self.tenants: dict[str, int] = {}
        self.kinds: dict[str, int] = {}
        self.one_in = array("q")  # one-turn sessions: prompt tokens
        self.one_out = array("q")  # and max_tokens
        self.one_by: dict[tuple[str, str], int] = {}  # and (tenant, role) counts

    def finish(self) -> None:
        """Merges the one-turn sessions into the distributions (call once, at the end)."""
        n = len(self.one_in)
        if not n:
            return
        self.turns_per = array("q", [1]) * n + self.turns_per
        self.first_in = self.one_in + self.first_in
        self.outputs = self.one_out + self.outputs
        self.context = self.one_in + self.context
        self.prompts = self.one_in + self.prompts
        for (tenant, role), count in self.one_by.items():
            self.tenants[tenant] = self.tenants.get(tenant, 0) + count
            self.roles[role] = self.roles.get(role, 0) + count
        self.kinds[STEP_FIRST] = self.kinds.get(STEP_FIRST, 0) + n
        self.one_in, self.one_out, self.one_by = array("q"), array("q"), {}

    def add(self, s: SessionShape) -> None:
        turns = s.turns
        self.turns_per.append(len(turns))
        self.tenants[s.tenant] = self.tenants.get(s.tenant, 0) + 1
        ctx = s.system_tokens
        last = len(turns) - 1
        context_after: list[int] = []
        children: dict[int, int] = {}
        for i, t in enumerate(turns):
            (self.first_in if i == 0 else self.follow_in).append(t.tokens)
            if i:
                self.thinks.append(t.think_time_s)
            self.outputs.append(t.max_tokens)
            self.roles[t.role] = self.roles.get(t.role, 0) + 1
            self.kinds[t.kind] = self.kinds.get(t.kind, 0) + 1
            cp = context_parent(s, i) if t.parents else None
            prompt = (s.system_tokens if cp is None else context_after[cp]) + t.tokens
            if t.parents and cp != t.parents[0]:  # a join also sends its children's outputs
                prompt += sum(turns[p].max_tokens for p in t.parents)
            self.prompts.append(prompt)
            context_after.append(prompt + t.max_tokens)
            if t.kind == STEP_FAN_OUT_CHILD and t.parents:
                children[t.parents[0]] = children.get(t.parents[0], 0) + 1
            ctx += t.tokens
            if i < last:
                ctx += t.max_tokens
        self.context.append(ctx)
        self.fan_out.extend(children.values())


def collect(
    workload: Workload,
    *,
    seed: int,
    n: int | None,
    tokenizer: TextTokenizer,
    block_size: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> tuple[ShapeFigures, ReuseCurve, np.ndarray | None]:
    """Shape figures, the reuse curve and the arrival offsets (None without timestamps) of
    sessions ``0..n-1`` (all of a file when ``n`` is None), in one pass."""
    block = block_size or workload_block_size(workload)
    shapes = ShapeFigures()
    reuse = SessionReuse(block)
    arrivals = array("d")
    timed = True
    one_in, one_out, one_by, one_reuse = shapes.one_in.append, shapes.one_out.append, shapes.one_by, reuse.add_one
    for s, arrival in session_shapes(workload, seed, n, tokenizer, progress=progress):
        if arrival is None:
            timed = False
        else:
            arrivals.append(arrival)
        if type(s) is tuple:  # (tenant, tokens, max_tokens, role): the fast lane of a trace's rows
            one_in(s[1])
            one_out(s[2])
            key = (s[0], s[3])
            one_by[key] = one_by.get(key, 0) + 1
            one_reuse(s[1], s[2], arrival)
        else:
            shapes.add(s)
            reuse.add(s, arrival)
    shapes.finish()
    offsets = np.frombuffer(arrivals, dtype=np.float64).copy() if timed and len(arrivals) else None
    return shapes, reuse.curve(), offsets


def workload_block_size(workload: Workload) -> int:
    """The trace's own block size (its hash_ids', or those of a session file's first session,
    as a counts-only export or an anonymised file writes them), else vLLM's default of 16 tokens."""
    own = getattr(workload, "block_size", None)
    if own:
        return own
    if getattr(workload, "rows", None) is None and workload.num_sessions:
        for blocks in workload.turn_hash_ids(0) or ():
            if blocks is not None:
                return blocks["block_size"]
    return DEFAULT_BLOCK_SIZE


def reuse_figures(curve: ReuseCurve, capacities_tokens: list[int] | None = None) -> dict[str, Any]:
    """Prefix reuse and the LRU capacity that realises it, in tokens (JSON-ready)."""
    B = curve.block_size
    reused = curve.hit_tokens(None)
    working_set = curve.working_set_blocks * B
    if capacities_tokens is None:
        capacities_tokens = default_capacities(working_set)
    return {
        "block_size": B,
        "prompt_tokens": curve.prompt_tokens,
        "reused_tokens": reused,
        "reuse": curve.hit_rate(None),
        "unique_shared_blocks": curve.unique_shared_blocks,
        "working_set_tokens": working_set,
        "capacity_tokens_for": {f"{share:.0%}": curve.capacity_for(share) * B for share in REUSE_SHARES},
        "hit_rate_at": [
            {
                "capacity_tokens": c,
                "hit_rate": curve.hit_rate(c // B),
                "share_of_reuse": curve.hit_tokens(c // B) / reused if reused else 0.0,
            }
            for c in capacities_tokens
        ],
    }


def default_capacities(working_set_tokens: int) -> list[int]:
    """64k tokens and up by factors of 4, to the first at or past the working set (at least one)."""
    out = [65_536]
    while out[-1] < working_set_tokens:
        out.append(out[-1] * 4)
    return out


def dist(values: array) -> dict[str, Any] | None:
    """count, min, p50/p90/p99, max, mean and total of ``values`` (None when empty)."""
    if not len(values):
        return None
    a = np.frombuffer(values, dtype=np.int64 if values.typecode == "q" else np.float64).astype(np.float64)
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {
        "count": len(a),
        "min": float(a.min()),
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
        "max": float(a.max()),
        "mean": float(a.mean()),
        "total": float(a.sum()),
    }
