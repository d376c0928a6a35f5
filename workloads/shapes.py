"""Sessions as sizes and prefix identities, without building their prompt text.

``inspect``, ``analyze`` and the reuse model need each turn's token count, its reply length, its
wait, its place in the session's DAG and which prompt pieces it shares with other sessions, not
its words. Where a format gives counts (traces, ``tokens`` and ``hash_ids`` turns of session
files), this reads them from the reader's records and builds no text; a text (a dataset's
message, a text system prompt) is counted once with the workload's tokenizer. Workloads that keep
no records (specs, plug-in formats) are built session by session and their texts counted once.

A message is **shareable** when another session may send the same tokens: a text (keyed by its
hash: equal texts share), a trace's prefix blocks (keyed by the block id, an int), a system prompt (the
tenant's synthetic prompt, where a shorter one is a prefix of a longer one, or a text). Synthetic
text from a token count is drawn from the session's own random stream: unique to the session.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from workloads.blocks import split_blocks
from workloads.dag import plan_turns
from workloads.model import STEP_FAN_OUT_CHILD, STEP_FIRST, STEP_FOLLOW_UP, STEP_JOIN, Session, Turn
from workloads.text import TextTokenizer
from workloads.workload import Workload

# A piece of prompt another session may share: (key, tokens). Tokens at the same offset of two
# pieces with one key are the same tokens (a shorter piece is a prefix of a longer one).
Piece = tuple[Any, int]


@dataclass(frozen=True, slots=True)
class TurnShape:
    """One step: its new message's tokens, reply length, wait and place in the session's DAG.

    ``pieces`` are the message's shareable pieces (they add up to ``tokens``), or None when the
    message is the session's own synthetic text. ``parents`` are indices of earlier steps
    (empty for the first); ``kind`` is a ``workloads.model`` step kind.
    """

    tokens: int
    max_tokens: int
    think_time_s: float = 0.0
    role: str = "user"
    pieces: tuple[Piece, ...] | None = None
    parents: tuple[int, ...] = ()
    kind: str = STEP_FIRST
    cold: bool = False


@dataclass(frozen=True, slots=True)
class SessionShape:
    """A session without its text: the system prompt as shareable pieces, then its steps."""

    index: int
    tenant: str
    system: tuple[Piece, ...]
    turns: tuple[TurnShape, ...]

    @property
    def system_tokens(self) -> int:
        return sum(n for _, n in self.system)


# A one-turn session of its own synthetic text and no system prompt (a row of an Azure or BurstGPT
# trace): (tenant, tokens, max_tokens, role). A plain tuple: at 10M rows, an object per row costs
# more than everything else inspect does with it.
OneTurn = tuple[str, int, int, str]


def session_shapes(
    workload: Workload,
    seed: int,
    n: int | None,
    tokenizer: TextTokenizer,
    *,
    progress: Callable[[int], None] | None = None,
) -> Iterator[tuple[SessionShape | OneTurn, float | None]]:
    """``(shape, arrival_s)`` of sessions ``0..n-1`` (all when ``n`` is None; a ``OneTurn`` tuple
    for the simplest), ``arrival_s`` from the first session's or None without timestamps.

    A trace read as a stream (``workloads.streamed``: it has ``rows()``) is read once, row by row.
    ``progress(k)`` is called every 4096 sessions and at the end.
    """
    rows = getattr(workload, "rows", None)
    if rows is not None and getattr(workload, "record", None) is None:
        # (record, time_s) of each TraceRow, taken in C: no Python frame per row.
        records: Iterator[tuple[dict[str, Any] | None, float | None]] = map(
            attrgetter("record", "time_s"), itertools.islice(rows(), n)
        )
    else:
        records = _held(workload, n)
    block_size = getattr(workload, "block_size", None) or 1
    k = -1
    t0: float | None = None
    for k, (rec, t) in enumerate(records):
        if progress is not None and not k & 4095 and k:
            progress(k)
        if t is None:
            arrival = None
        else:
            if t0 is None:
                t0 = t
            arrival = t - t0
        if rec is None:
            yield shape_of_session(workload.session(seed, k), tokenizer), arrival
            continue
        turns = rec["turns"]
        if len(turns) == 1 and "system_prompt" not in rec and "system_prompt_tokens" not in rec:
            t1 = turns[0]
            if "tokens" in t1 and "hash_ids" not in t1 and "cold" not in t1:  # a trace's row
                yield (rec["tenant"], t1["tokens"], t1["max_tokens"], t1.get("role", "user")), arrival
                continue
        yield _shape_of_record(k, rec, block_size, tokenizer), arrival
    if progress is not None:
        progress(k + 1)


def _held(workload: Workload, n: int | None) -> Iterator[tuple[dict[str, Any] | None, float | None]]:
    total = workload.num_sessions
    if n is None:
        if total is None:
            raise ValueError("n is required for a workload without end")
        n = total
    elif total is not None:
        n = min(n, total)
    offsets = workload.arrival_offsets()
    record = getattr(workload, "record", None)
    for k in range(n):
        rec = record(k) if record is not None else _file_record(workload, k)
        yield rec, None if offsets is None else float(offsets[k])


def _file_record(workload: Workload, index: int) -> dict[str, Any] | None:
    # A session file keeps its parsed lines; it offers no public accessor yet, and building every
    # turn's text to count it again is what made inspect slow on large files.
    records = getattr(workload, "_records", None)
    return records[index] if isinstance(records, list) else None


def _shape_of_record(index: int, rec: dict[str, Any], block_size: int, tokenizer: TextTokenizer) -> SessionShape:
    tenant = rec["tenant"]
    if "system_prompt_tokens" in rec:
        n_sys = rec["system_prompt_tokens"]
        system: tuple[Piece, ...] = ((("sys", tenant), n_sys),) if n_sys else ()
    else:
        system = _text_pieces(rec.get("system_prompt", ""), tokenizer)
    raw = rec["turns"]
    dag = any("id" in t or "parents" in t or "kind" in t for t in raw)
    parents_of = _dag_parents(raw) if dag else None
    turns = []
    for i, t in enumerate(raw):
        if "content" in t:
            pieces = _text_pieces(t["content"], tokenizer)
            n_tok = pieces[0][1] if pieces else 0
        elif "blocks" in t:  # a block id is its piece's key: an int, unlike every other key
            pieces = tuple(map(tuple, t["blocks"]))
            n_tok = sum(m for _, m in pieces)
        elif "hash_ids" in t:
            pieces = tuple(map(tuple, split_blocks(t["hash_ids"], t["tokens"], t["block_size"])))
            n_tok = t["tokens"]
        else:
            pieces, n_tok = None, t["tokens"]
        if parents_of is not None:
            parents, kind = parents_of[i]
        else:
            parents, kind = ((i - 1,) if i else ()), (STEP_FOLLOW_UP if i else STEP_FIRST)
        turns.append(
            TurnShape(
                tokens=n_tok,
                max_tokens=t["max_tokens"],
                think_time_s=t.get("think_time", 0.0),
                role=t.get("role", "user"),
                pieces=pieces,
                parents=parents,
                kind=kind,
                cold=t.get("cold", False),
            )
        )
    return SessionShape(index=index, tenant=tenant, system=system, turns=tuple(turns))


def _dag_parents(raw: list[dict[str, Any]]) -> list[tuple[tuple[int, ...], str]]:
    plan = plan_turns(
        [
            Turn("", 1, step_id=t.get("id", ""), kind=t.get("kind", ""),
                 parent_ids=tuple(t["parents"]) if "parents" in t else None)
            for t in raw
        ],
        where="session",
    )  # fmt: skip
    pos = {s.step_id: s.index for s in plan.steps}
    return [(tuple(pos[p] for p in s.parent_ids), s.kind) for s in plan.steps]


def shape_of_session(session: Session, tokenizer: TextTokenizer) -> SessionShape:
    """The shape of a built session: every text counted once and keyed by its hash."""
    plan = plan_turns(session.turns, where=f"session {session.session_id}")
    pos = {s.step_id: s.index for s in plan.steps}
    turns = []
    for t, step in zip(session.turns, plan.steps, strict=True):
        pieces = _text_pieces(t.content, tokenizer)
        turns.append(
            TurnShape(
                tokens=pieces[0][1] if pieces else 0,
                max_tokens=t.max_tokens,
                think_time_s=t.think_time_s,
                role=t.role,
                pieces=pieces,
                parents=tuple(pos[p] for p in step.parent_ids),
                kind=step.kind,
                cold=t.cold,
            )
        )
    return SessionShape(
        index=session.index,
        tenant=session.tenant,
        system=_text_pieces(session.system_prompt, tokenizer),
        turns=tuple(turns),
    )


def _text_pieces(text: str, tokenizer: TextTokenizer) -> tuple[Piece, ...]:
    if not text:
        return ()
    return ((("c", hash(text)), tokenizer.count(text)),)


def context_parent(shape: SessionShape, i: int) -> int | None:
    """The step whose whole context (with its reply) leads step ``i``'s prompt, or None for a root.

    A join's prompt extends the step its fan-out children extended (the children's outputs come
    after that context), so its context parent is that step. A join's parent may be the last step
    of a branch (a child's chain): the branch is walked up to its child first.
    """
    t = shape.turns[i]
    if not t.parents:
        return None
    p = t.parents[0]
    if t.kind == STEP_JOIN:
        while shape.turns[p].kind != STEP_FAN_OUT_CHILD and shape.turns[p].parents:
            p = shape.turns[p].parents[0]
        grand = shape.turns[p].parents
        return grand[0] if grand else None
    return p
