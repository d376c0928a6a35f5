"""Anonymised sessions: no text, only block hashes of the tokens, sizes, timings and structure.

Each turn's message becomes ``tokens`` (its length under loadgen's tokenizer, the sim's) and
``hash_ids``: one id per ``block_size`` tokens (the last block may be partial), as in a Mooncake
trace. Ids are **prefix-chained**: a block's id is a keyed hash of the id before it and its own
tokens, so it depends on every token before it in the session (the system prompt and the messages
of the steps it extends). Two sessions that send the same leading tokens get the same leading ids;
from the first differing block on, their ids differ.

The hash is BLAKE2b keyed with a **salt drawn at random for each file** (16 bytes, never written):
within one file equal blocks share an id, but a dictionary of common blocks (a popular system
prompt hashed in advance) matches nothing, and the same text gets unrelated ids in two files.
Ids are 63-bit integers.

What is kept: session order and arrival times, tenants, turn roles, ``max_tokens``, think times,
``cold`` flags and the DAG (step ids, kinds, parents, tool names). Session ids become
``anon-<k>`` (a captured id may name a person). A session file has no block ids for a system
prompt, so the system prompt's tokens lead the first turn's blocks (the replay sends them in the
first user message: the same prefix, one chat-template marker fewer).

Replayed (``workloads.sessions_jsonl``: block b's text depends only on (seed, b)), a file shares
prefixes where the original did and nowhere else, so a prefix cache hits as on the original, to
a block: sharing is kept in whole blocks, so a shared prefix that ends inside a block loses that
block's tokens (choose ``block_size`` near the engine's to keep them).

**Mooncake form** (``FORMAT_MOONCAKE``, :func:`mooncake_rows`): the same ids as AIPerf's
multi-turn ``mooncake_trace`` rows, one per turn in session order, keyed ``session_id`` ``anon-<k>``:
the first row's ``timestamp`` is the session's arrival (ms since the file's first), a follow-up's
``delay`` its think time (ms); ``input_length`` and ``hash_ids`` are the turn's own message (the
replayer sends the conversation so far before it, with its live replies: a reply's text is not
kept, so neither are its blocks), ``output_length`` its ``max_tokens``. Rows cannot say a turn's
role, ``cold``, tool name or DAG links: a session with sub-agents (fan-out) is written flattened,
its steps' rows in plan order as one conversation, and counted (:class:`AnonymizeCounts`). An empty
message (no tokens) is written as one token with an id of its own, as a row needs one.

:func:`anonymize_session` is pure (a ``Session`` in, an :class:`AnonymizedSession` out);
:func:`write_anonymized` writes a workload's sessions as a session file or as Mooncake rows.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workloads.dag import plan_turns
from workloads.errors import WorkloadError
from workloads.model import STEP_JOIN, Session
from workloads.tokenizer import pieces
from workloads.workload import Workload

DEFAULT_BLOCK_SIZE = 512  # Mooncake's
FORMAT_SESSIONS = "sessions"  # loadgen's session file
FORMAT_MOONCAKE = "mooncake"  # AIPerf's multi-turn mooncake_trace rows
FORMATS = (FORMAT_SESSIONS, FORMAT_MOONCAKE)
SALT_BYTES = 16
_ID_MASK = (1 << 63) - 1
_ROOT = b"\0" * 8


def new_salt() -> bytes:
    """A fresh random salt: one per anonymised file."""
    return secrets.token_bytes(SALT_BYTES)


@dataclass(frozen=True, slots=True)
class AnonymizedTurn:
    """One step without its text: its tokens as prefix-chained block ids, and what it asked."""

    tokens: int
    hash_ids: tuple[int, ...]
    max_tokens: int
    think_time_s: float = 0.0
    role: str = "user"
    cold: bool = False
    step_id: str | None = None  # set (with kind and parents) for a DAG session only
    kind: str | None = None
    parents: tuple[str, ...] | None = None
    tool_call: str | None = None


@dataclass(frozen=True, slots=True)
class AnonymizedSession:
    """A session of :class:`AnonymizedTurn`s; ``arrival_s`` when the source had times."""

    session_id: str
    tenant: str
    block_size: int
    turns: tuple[AnonymizedTurn, ...]
    arrival_s: float | None = None


def anonymize_session(
    session: Session, *, salt: bytes, block_size: int = DEFAULT_BLOCK_SIZE, index: int | None = None,
    arrival_s: float | None = None,
) -> AnonymizedSession:  # fmt: skip
    """``session`` as block ids under ``salt`` (one salt for every session of a file).

    ``index`` names it ``anon-<index>`` (default: the session's own index).
    """
    if block_size < 1:
        raise WorkloadError(f"--block-size {block_size} is not allowed; use an integer >= 1")
    if len(salt) < SALT_BYTES:
        raise ValueError(f"salt must be at least {SALT_BYTES} bytes")
    plan = plan_turns(session.turns, where=f"session {session.session_id}")
    dag = plan.is_dag() or any(t.tool_call is not None for t in session.turns)
    pos = {s.step_id: s.index for s in plan.steps}
    last_id: list[bytes] = []  # per step: the chain's id after its message
    turns = []
    for t, step in zip(session.turns, plan.steps, strict=True):
        words = pieces(t.content)
        if step.parent_ids:
            parent = pos[step.parent_ids[0]]
            if step.kind == STEP_JOIN:  # a join extends what its fan-out's children extended
                grand = plan.steps[parent].parent_ids
                chain = last_id[pos[grand[0]]] if grand else _ROOT
            else:
                chain = last_id[parent]
        else:
            words = pieces(session.system_prompt) + words
            chain = _ROOT
        ids = []
        for start in range(0, len(words), block_size):
            block = "\x1f".join(words[start : start + block_size]).encode("utf-8")
            chain = hashlib.blake2b(chain + block, key=salt, digest_size=8).digest()
            ids.append(int.from_bytes(chain, "big") & _ID_MASK)
        last_id.append(chain)
        turns.append(
            AnonymizedTurn(
                tokens=len(words),
                hash_ids=tuple(ids),
                max_tokens=t.max_tokens,
                think_time_s=t.think_time_s,
                role=t.role,
                cold=t.cold,
                step_id=step.step_id if dag else None,
                kind=step.kind if dag else None,
                parents=step.parent_ids if dag else None,
                tool_call=t.tool_call,
            )
        )
    k = session.index if index is None else index
    return AnonymizedSession(f"anon-{k:06d}", session.tenant, block_size, tuple(turns), arrival_s)


def anonymized_record(s: AnonymizedSession) -> dict[str, Any]:
    """The session-file object (docs/workloads.md, "Session files") of an anonymised session."""
    rec: dict[str, Any] = {"id": s.session_id, "tenant": s.tenant, "system_prompt_tokens": 0}
    if s.arrival_s is not None:
        rec["arrival_s"] = round(s.arrival_s, 6)
    turns = []
    for i, t in enumerate(s.turns):
        out: dict[str, Any]
        if t.tokens:
            out = {"tokens": t.tokens, "hash_ids": list(t.hash_ids), "block_size": s.block_size}
        else:
            out = {"content": ""}  # an empty message: nothing to hash, nothing to leak
        out["max_tokens"] = t.max_tokens
        if i:
            out["think_time"] = round(t.think_time_s, 6)  # a trace's clock differences carry float noise
        out["role"] = t.role
        if t.cold:
            out["cold"] = True
        if t.step_id is not None:
            out["id"] = t.step_id
            out["kind"] = t.kind
            out["parents"] = list(t.parents or ())
        if t.tool_call is not None:
            out["tool_call"] = t.tool_call
        turns.append(out)
    rec["turns"] = turns
    return rec


def is_flattened(s: AnonymizedSession) -> bool:
    """Whether the Mooncake form flattens ``s``: some step does not extend the step before it."""
    prev: str | None = None
    for t in s.turns:
        if t.parents is not None and tuple(t.parents) != ((prev,) if prev is not None else ()):
            return True
        prev = t.step_id
    return False


def mooncake_rows(s: AnonymizedSession, *, salt: bytes) -> list[dict[str, Any]]:
    """The Mooncake rows of ``s`` (module docstring, "Mooncake form"), one per turn."""
    rows = []
    for i, t in enumerate(s.turns):
        row: dict[str, Any] = {"session_id": s.session_id}
        if i == 0:
            if s.arrival_s is not None:
                row["timestamp"] = _ms(s.arrival_s)
        else:
            row["delay"] = _ms(t.think_time_s)
        if t.tokens:
            row["input_length"], ids = t.tokens, list(t.hash_ids)
        else:  # a row needs a token; this one's id is keyed like the rest, so it shares nothing
            key = f"{s.session_id}/{i}/empty".encode()
            row["input_length"], ids = 1, [int.from_bytes(hashlib.blake2b(key, key=salt, digest_size=8).digest(), "big") & _ID_MASK]
        row["output_length"] = t.max_tokens
        row["hash_ids"] = ids
        rows.append(row)
    return rows


def _ms(seconds: float) -> int | float:
    """Milliseconds to the microsecond, a whole number written as an integer (older AIPerf wants one)."""
    ms = round(seconds * 1000.0, 3)
    return int(ms) if ms.is_integer() else ms


@dataclass(slots=True)
class AnonymizeCounts:
    """What :func:`write_anonymized` wrote: sessions, and (Mooncake form) those flattened."""

    sessions: int = 0
    flattened: int = 0


def anonymized_sessions(
    workload: Workload, seed: int, n: int | None, *, salt: bytes, block_size: int = DEFAULT_BLOCK_SIZE
) -> Iterator[AnonymizedSession]:
    """Sessions ``0..n-1`` of ``workload`` (all of a file when ``n`` is None), anonymised, with
    their arrival times. A trace read as a stream is read once, row by row."""
    rows = getattr(workload, "rows", None)
    build = getattr(workload, "record_session", None)
    if rows is not None and build is not None and getattr(workload, "record", None) is None:
        t0: float | None = None
        for k, row in enumerate(rows()):
            if n is not None and k >= n:
                return
            arrival = None
            if row.time_s is not None:
                t0 = row.time_s if t0 is None else t0
                arrival = row.time_s - t0
            yield anonymize_session(build(seed, k, row.record), salt=salt, block_size=block_size, index=k, arrival_s=arrival)
        return
    total = workload.num_sessions
    if n is None or (total is not None and n > total):
        if total is None:
            raise WorkloadError(f"{workload.source}: generates sessions without end; give -n")
        n = total
    offsets = workload.arrival_offsets()
    for k, session in enumerate(workload.sessions(seed, n)):
        arrival = None if offsets is None else float(offsets[k])
        yield anonymize_session(session, salt=salt, block_size=block_size, index=k, arrival_s=arrival)


def write_anonymized(
    workload: Workload,
    seed: int,
    n: int | None,
    path: str | Path,
    *,
    block_size: int = DEFAULT_BLOCK_SIZE,
    salt: bytes | None = None,
    progress: Callable[[int], None] | None = None,
    form: str = FORMAT_SESSIONS,
    counts: AnonymizeCounts | None = None,
) -> int:
    """Write ``workload``'s sessions anonymised to ``path`` (atomically: a temporary file beside
    it, then renamed) as a session file or (``form`` ``"mooncake"``) Mooncake rows; a fresh salt
    unless given. Returns the sessions written (``counts`` gets them and those flattened);
    ``progress(k)`` is called every 4096 sessions."""
    if form not in FORMATS:
        raise WorkloadError(f"anonymised format {form!r} is not known; use one of {', '.join(FORMATS)}")
    path = Path(path)
    key = salt if salt is not None else new_salt()
    tally = counts if counts is not None else AnonymizeCounts()
    tmp = path.with_name(f"{path.name}.{secrets.token_hex(6)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask's mode, as any file
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for s in anonymized_sessions(workload, seed, n, salt=key, block_size=block_size):
                if form == FORMAT_MOONCAKE:
                    tally.flattened += is_flattened(s)
                    f.writelines(json.dumps(row, separators=(",", ":")) + "\n" for row in mooncake_rows(s, salt=key))
                else:
                    f.write(json.dumps(anonymized_record(s), separators=(",", ":")))
                    f.write("\n")
                tally.sessions += 1
                if progress is not None and not tally.sessions & 4095:
                    progress(tally.sessions)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise WorkloadError(f"{path}: cannot write the anonymised file ({e.strerror or e}); give a writable path") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tally.sessions
