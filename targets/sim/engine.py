"""The simulated engine: a deterministic continuous-batching scheduler on a virtual clock.

Nothing here touches a socket or the wall clock. Feed requests with ``add(..., arrival_s=t)``,
call ``step()`` until ``has_work()`` is false, and read each ``SimSequence``'s ``token_times_s``.
``simulate()`` does that loop for a list of arrivals. The server (``server.py``) drives the same
object in real time.

One step (vLLM V1-like):

1. Running sequences keep their place, in admission order: a decoding sequence takes 1 token of the
   step's token budget (``max_num_batched_tokens``), a sequence still in prefill takes the next chunk
   of its prompt (chunked prefill) up to what is left of the budget.
2. Waiting sequences are admitted first-come first-served while there are free slots
   (``max_num_seqs``), budget, and KV blocks: a request looks up the longest cached prefix of its
   prompt (whole blocks; at least one prompt token is always computed), pins those blocks and
   reserves blocks for the rest of its prompt and all of its ``max_tokens`` (so it is never
   preempted). If the head of the queue does not fit, nobody behind it is admitted.

   With the profile's ``preemption`` on, blocks come on demand instead, as in vLLM V1: admission
   reserves the prompt's blocks only, and a running sequence takes a block when its next token
   needs one. When none can be had, the newest running sequence is preempted (recompute mode): its
   blocks are freed (its full blocks stay in the prefix cache, unpinned), it goes back to the head
   of the queue, and once readmitted it prefills its prompt *and* the tokens it generated before
   its next token comes (a stall in its token times). No one is admitted in a step that preempted.
3. The step lasts ``profile.step_s(tokens computed, KV tokens read)``. At its end a sequence that
   finished its prompt emits its first token, every decoding sequence emits one more, full blocks
   (prompt and generated tokens) enter the prefix cache, and sequences with ``max_tokens`` tokens
   finish and release their blocks.

A request that arrives while a step runs waits for the next step. ``add`` raises ``QueueFull``
when ``max_waiting`` requests are already waiting (the server answers 429).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from targets.sim.prefix_cache import ROOT_HASH, PrefixCache, block_hash, block_hashes
from targets.sim.profile import Profile
from targets.sim.text import WORD_TOKEN_IDS, reply_words

WAITING = "waiting"
RUNNING = "running"
FINISHED = "finished"
ABORTED = "aborted"


class QueueFull(Exception):
    """The waiting queue holds ``max_waiting`` requests already."""


class RequestTooLong(ValueError):
    """Prompt plus ``max_tokens`` exceeds ``max_model_len`` (or the whole KV pool)."""


@dataclass(slots=True, eq=False)
class SimSequence:
    """One request inside the engine. Times are virtual seconds."""

    rid: str
    prompt_len: int
    max_tokens: int
    arrival_s: float
    eligible_s: float  # arrival + request overhead: earliest time it can be scheduled
    token_ids: list[int]  # prompt ids followed by the reply's ids
    words: list[int]  # reply, as indices into text.WORDS
    handle: Any = None  # the server's stream object; the engine never looks at it
    state: str = WAITING
    cached_tokens: int = 0
    computed: int = 0  # prompt tokens whose KV exists (cached ones included)
    generated: int = 0
    pinned: list[int] = field(default_factory=list)  # hash ids of this sequence's cached blocks
    private: int = 0  # reserved blocks not yet turned into cached blocks
    prefill_len: int = 0  # tokens to compute before the next token: the prompt, plus the reply so far after a preemption
    preemptions: int = 0  # times its KV was freed under pressure (recomputed on readmission)
    scheduled_s: float | None = None
    first_token_s: float | None = None
    finished_s: float | None = None
    token_times_s: list[float] = field(default_factory=list)

    @property
    def queue_s(self) -> float | None:
        """Arrival to admission."""
        return None if self.scheduled_s is None else self.scheduled_s - self.arrival_s

    @property
    def prefill_s(self) -> float | None:
        """Admission to first token (the steps that computed the uncached prompt)."""
        if self.first_token_s is None or self.scheduled_s is None:
            return None
        return self.first_token_s - self.scheduled_s


@dataclass(slots=True)
class Step:
    """What one engine step did."""

    start_s: float
    end_s: float
    emitted: list[SimSequence]  # each produced one token at end_s
    finished: list[SimSequence]
    num_seqs: int
    num_tokens: int
    kv_tokens_read: int


@dataclass(slots=True)
class EngineStats:
    """Monotonic counters (the ``sim:*_total`` metrics)."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_cache_queries: int = 0  # prompt tokens looked up at admission
    prefix_cache_hits: int = 0  # of which found cached
    finished: int = 0
    aborted: int = 0
    rejected: int = 0
    steps: int = 0
    preemptions: int = 0
    busy_s: float = 0.0  # virtual seconds spent in steps, the last one whole (its power: targets/sim/power.py)


class Engine:
    """Continuous batching with chunked prefill and a block prefix cache, on a virtual clock."""

    def __init__(self, profile: Profile, seed: int = 0) -> None:
        self.profile = profile
        self.seed = seed
        self.now = 0.0
        self.cache = PrefixCache(profile.num_blocks, profile.block_size_tokens)
        self._on_demand = profile.preemption  # KV blocks as tokens need them, preempting under pressure
        self.stats = EngineStats()
        self.last_step_start_s = 0.0  # virtual start of the latest step (it may still be running in wall time)
        self._waiting: deque[SimSequence] = deque()
        self._running: list[SimSequence] = []
        self._last_arrival = 0.0

    # --- state -------------------------------------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def has_work(self) -> bool:
        return bool(self._running or self._waiting)

    def next_step_start(self) -> float | None:
        """Virtual time the next step would start at, or None when there is nothing to do."""
        if self._running:
            return self.now
        if self._waiting:
            return max(self.now, self._waiting[0].eligible_s)
        return None

    # --- requests ----------------------------------------------------------------------------
    def add(
        self,
        rid: str,
        prompt_ids: Sequence[int],
        max_tokens: int,
        arrival_s: float | None = None,
        handle: Any = None,
    ) -> SimSequence:
        """Queue a request arriving at ``arrival_s`` (default: now). Arrivals must not go back in
        time (an earlier one is taken as arriving with the previous one).

        Raises ``RequestTooLong`` if it can never run and ``QueueFull`` if the queue is full.
        """
        p = self.profile
        prompt_len = len(prompt_ids)
        if prompt_len < 1:
            raise RequestTooLong("the prompt has no tokens")
        if max_tokens < 1:
            raise RequestTooLong("max_tokens must be at least 1")
        total = prompt_len + max_tokens
        if total > p.max_model_len:
            raise RequestTooLong(
                f"prompt ({prompt_len} tokens) plus max_tokens ({max_tokens}) exceeds the model's "
                f"context of {p.max_model_len} tokens"
            )
        if len(self._waiting) >= p.max_waiting:
            self.stats.rejected += 1
            raise QueueFull(f"{len(self._waiting)} requests are waiting (max_waiting {p.max_waiting})")
        t = self.now if arrival_s is None else max(arrival_s, self._last_arrival)
        self._last_arrival = t
        words = reply_words(self.seed, prompt_ids, max_tokens)
        ids = list(prompt_ids)
        ids.extend(WORD_TOKEN_IDS[w] for w in words)
        seq = SimSequence(
            rid=rid,
            prompt_len=prompt_len,
            max_tokens=max_tokens,
            arrival_s=t,
            eligible_s=t + p.request_overhead_s,
            token_ids=ids,
            words=words,
            handle=handle,
            prefill_len=prompt_len,
        )
        self._waiting.append(seq)
        return seq

    def abort(self, seq: SimSequence) -> None:
        """Drop a request (client gone): it leaves the queue or the batch and frees its blocks."""
        if seq.state == WAITING:
            self._waiting.remove(seq)
        elif seq.state == RUNNING:
            self._running.remove(seq)
            self.cache.release(seq.pinned, seq.private)
            seq.private = 0
        else:
            return
        seq.state = ABORTED
        seq.finished_s = self.now
        self.stats.aborted += 1

    # --- the step ----------------------------------------------------------------------------
    def step(self) -> Step | None:
        """Run one step from ``now`` (jumping ahead to the first waiting request if idle)."""
        start = self.next_step_start()
        if start is None:
            return None
        self.now = start
        p = self.profile
        budget = p.max_num_batched_tokens
        tokens = 0
        kv_read = 0
        scheduled: list[tuple[SimSequence, int]] = []
        preemptions_before = self.stats.preemptions

        running = self._running
        i = 0
        while i < len(running):
            seq = running[i]
            if budget <= 0:
                break
            if seq.computed < seq.prefill_len:
                n = min(seq.prefill_len - seq.computed, budget)
                kv_after = seq.computed + n
            else:
                n = 1
                kv_after = seq.prompt_len + seq.generated
            if self._on_demand and not self._allocate(seq, kv_after):
                continue  # seq itself was preempted (it was the newest running): nothing left to schedule
            kv_read += kv_after
            budget -= n
            tokens += n
            scheduled.append((seq, n))
            i += 1
        preempted = self.stats.preemptions > preemptions_before

        waiting = self._waiting
        while not preempted and waiting and budget > 0 and len(running) < p.max_num_seqs:
            seq = waiting[0]
            if seq.eligible_s > start or not self._admit(seq):
                break
            waiting.popleft()
            seq.state = RUNNING
            if seq.scheduled_s is None:  # a preempted sequence keeps its first admission time
                seq.scheduled_s = start
            running.append(seq)
            n = min(seq.prefill_len - seq.computed, budget)
            kv_read += seq.computed + n
            budget -= n
            tokens += n
            scheduled.append((seq, n))

        end = start + p.step_s(tokens, kv_read)
        emitted: list[SimSequence] = []
        finished: list[SimSequence] = []
        bs = p.block_size_tokens
        cache = self.cache
        for seq, n in scheduled:
            if seq.computed < seq.prefill_len:
                seq.computed += n
                if seq.computed < seq.prefill_len:
                    kv_tokens = seq.computed
                else:  # the (re)computed prefill gives the next token
                    seq.generated += 1
                    if seq.first_token_s is None:
                        seq.first_token_s = end
                    seq.token_times_s.append(end)
                    emitted.append(seq)
                    kv_tokens = seq.prefill_len
            else:
                seq.generated += 1
                seq.token_times_s.append(end)
                emitted.append(seq)
                kv_tokens = seq.prompt_len + seq.generated - 1  # the newest token has no KV yet
            pinned = seq.pinned
            while (len(pinned) + 1) * bs <= kv_tokens:
                i = len(pinned)
                h = block_hash(pinned[-1] if pinned else ROOT_HASH, seq.token_ids[i * bs : (i + 1) * bs])
                cache.commit(h)
                seq.private -= 1
                pinned.append(h)
            if seq.generated >= seq.max_tokens:
                seq.state = FINISHED
                seq.finished_s = end
                cache.release(pinned, seq.private)
                seq.private = 0
                finished.append(seq)

        if finished:
            self._running = [s for s in self._running if s.state == RUNNING]
            self.stats.finished += len(finished)
        self.stats.generation_tokens += len(emitted)
        self.stats.steps += 1
        self.stats.busy_s += end - start
        self.last_step_start_s = start
        self.now = end
        return Step(start, end, emitted, finished, len(scheduled), tokens, kv_read)

    def _admit(self, seq: SimSequence) -> bool:
        """Pin the cached prefix and reserve blocks for the rest (with ``preemption``: of the
        prefill only); False if the pool is too full."""
        p = self.profile
        bs = p.block_size_tokens
        todo = seq.prefill_len  # the prompt, or after a preemption the prompt and the reply so far
        hashes = block_hashes(seq.token_ids[:todo], bs)
        hits = self.cache.match(hashes)
        if hits * bs >= todo:  # always compute at least the last token
            hits = (todo - 1) // bs
        need = math.ceil((todo if self._on_demand else seq.prompt_len + seq.max_tokens) / bs) - hits
        if not self.cache.reserve(hashes[:hits], need):
            return False
        seq.pinned = hashes[:hits]
        seq.private = need
        seq.computed = hits * bs
        st = self.stats
        st.prefix_cache_queries += todo
        st.prefix_cache_hits += seq.computed
        if not seq.preemptions:  # a recompute is not a new prompt
            seq.cached_tokens = seq.computed
            st.prompt_tokens += seq.prompt_len
        return True

    def _allocate(self, seq: SimSequence, kv_tokens: int) -> bool:
        """Give running ``seq`` the blocks ``kv_tokens`` of KV need, preempting the newest running
        sequences until they fit. False when ``seq`` itself had to go (it was the newest)."""
        have = len(seq.pinned) + seq.private
        need = -(-kv_tokens // self.profile.block_size_tokens) - have
        if need <= 0:
            return True
        running = self._running
        while not self.cache.reserve((), need):
            victim = running[-1]
            self._preempt(victim)
            if victim is seq:
                return False
        seq.private += need
        return True

    def _preempt(self, seq: SimSequence) -> None:
        """Recompute mode: free the sequence's KV and put it back at the head of the queue; its
        prefill on readmission covers the prompt and every token generated so far."""
        self._running.remove(seq)
        self.cache.release(seq.pinned, seq.private)
        seq.pinned = []
        seq.private = 0
        seq.computed = 0
        seq.prefill_len = seq.prompt_len + seq.generated
        seq.state = WAITING
        seq.preemptions += 1
        self.stats.preemptions += 1
        self._waiting.appendleft(seq)


@dataclass(frozen=True, slots=True)
class Arrival:
    """One request for ``simulate``."""

    t_s: float
    rid: str
    prompt_ids: Sequence[int]
    max_tokens: int


def simulate(engine: Engine, arrivals: Iterable[Arrival]) -> dict[str, SimSequence | None]:
    """Run ``engine`` over ``arrivals`` until all are done. Returns rid -> sequence (None when the
    request was rejected with ``QueueFull``). A request arriving exactly at a step's start joins it."""
    pending = deque(sorted(arrivals, key=lambda a: a.t_s))
    out: dict[str, SimSequence | None] = {}
    while pending or engine.has_work():
        start = engine.next_step_start()
        while pending and (start is None or pending[0].t_s <= start):
            a = pending.popleft()
            try:
                out[a.rid] = engine.add(a.rid, a.prompt_ids, a.max_tokens, arrival_s=a.t_s)
            except QueueFull:
                out[a.rid] = None
            start = engine.next_step_start()
        engine.step()
    return out
