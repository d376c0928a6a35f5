"""Session files: one JSON object per line, one session per line, replayed as written.

Line format (docs/workloads.md)::

    {"id": "s42-000000", "tenant": "team-a",
     "system_prompt": "..."            # or "system_prompt_tokens": 2000 (or neither: no system prompt)
     "turns": [{"content": "...", "max_tokens": 64},            # or "tokens": 300 instead of content
               {"tokens": 1200, "max_tokens": 64, "think_time": 1.5, "role": "tool", "cold": false}]}

A session may be a DAG of steps (docs/workloads.md, "Agent sessions as DAGs"): a turn may add
``"id"`` (its step id), ``"kind"`` (``first``, ``follow-up``, ``fan-out child``, ``join``),
``"parents"`` (the step ids it waits for) and ``"tool_call"`` (the tool call it answers); absent,
they make the chain above, so older files replay unchanged.

Session k is the k-th non-blank line. Given texts are sent as they are, whatever the seed. Token
counts become text deterministically from (seed, index), with the same streams the synthetic
generator uses, so a file written with ``include_text=False`` replays the same sessions for the seed
it was written with. ``think_time`` is seconds (a number) or a duration string (``"1500ms"``), and is
absent or 0 on the first turn.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from analysis.units import parse_duration_s
from workloads.blocks import BlockTexts, blocks_needed, split_blocks
from workloads.compressed import read_bytes
from workloads.dag import plan_turns
from workloads.errors import WorkloadError
from workloads.model import Session, Turn
from workloads.readers.stream import TraceRow, iter_text_lines
from workloads.spec import DEFAULT_TENANT, GENERATOR_VERSION
from workloads.text import TextTokenizer
from workloads.tokenizer import count_tokens
from workloads.workload import Workload, check_seed_index, session_rng, system_prompt_text

SESSION_KEYS = ("id", "tenant", "system_prompt", "system_prompt_tokens", "turns", "arrival_s")
TURN_KEYS = (
    "content", "tokens", "max_tokens", "think_time", "role", "cold", "id", "kind", "parents", "tool_call",
    "hash_ids", "block_size",
)  # fmt: skip
ROLES = ("user", "tool")


class SessionFileWorkload(Workload):
    """The sessions of a JSONL file; ``num_sessions`` is the number of lines holding one."""

    kind = "sessions"

    def __init__(self, records: list[dict[str, Any]], *, name: str, source: str):
        # With arrival times, session k is the k-th arrival (a capture writes sessions as they end).
        timed = [r for r in records if "arrival_s" in r]
        if timed and len(timed) != len(records):
            missing = next(i for i, r in enumerate(records) if "arrival_s" not in r)
            raise WorkloadError(
                f"{source}: session {records[missing]['id']!r} has no arrival_s but others have; "
                "give arrival_s on every line or on none"
            )
        self._offsets = None
        if timed:
            records = sorted(records, key=lambda r: r["arrival_s"])
            t0 = records[0]["arrival_s"]
            self._offsets = np.array([r["arrival_s"] - t0 for r in records], dtype=np.float64)
        self._records = records
        self.name = name
        self.source = source
        self._tenants = tuple(dict.fromkeys(r["tenant"] for r in records))
        self._blocks = BlockTexts()

    @property
    def num_sessions(self) -> int:
        return len(self._records)

    @property
    def tenants(self) -> tuple[str, ...]:
        return self._tenants

    def arrival_offsets(self) -> np.ndarray | None:
        return None if self._offsets is None else self._offsets.copy()

    def session(self, seed: int, index: int) -> Session:
        check_seed_index(seed, index, len(self._records), where=self.source)
        return build_session(self._records[index], seed, index, name=self.name, tokenizer=self.tokenizer, blocks=self._blocks)

    def turn_hash_ids(self, index: int) -> list[dict[str, Any] | None] | None:
        turns = self._records[index]["turns"]
        if not any("hash_ids" in t for t in turns):
            return None
        return [
            {"hash_ids": t["hash_ids"], "block_size": t["block_size"], "tokens": t["tokens"]} if "hash_ids" in t else None
            for t in turns
        ]

    def fingerprint(self) -> str:
        """sha256 over the parsed sessions (not the bytes: key order and spacing do not count)."""
        h = hashlib.sha256(f"sessions:{GENERATOR_VERSION}\n".encode())
        for rec in self._records:
            h.update(json.dumps(rec, sort_keys=True, separators=(",", ":")).encode())
            h.update(b"\n")
        return self.with_tokenizer(h.hexdigest())

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "source": self.source,
            "fingerprint": self.fingerprint(),
            "num_sessions": self.num_sessions,
        }


def build_session(
    rec: dict[str, Any], seed: int, index: int, *, name: str, tokenizer: TextTokenizer, blocks: BlockTexts
) -> Session:
    """Session ``index`` for ``seed`` from its parsed line ``rec`` (``_parse_line``): what a whole
    file's ``SessionFileWorkload`` and a streamed one (``workloads.streamed``) both build."""
    if "system_prompt_tokens" in rec:
        system = system_prompt_text(seed, rec["tenant"], rec["system_prompt_tokens"], tokenizer)
    else:
        system = rec["system_prompt"]
    r_text = session_rng(seed, index, "text")
    turns = tuple(
        Turn(
            content=_turn_text(seed, t, r_text, tokenizer, blocks),
            max_tokens=t["max_tokens"],
            think_time_s=t["think_time"],
            role=t["role"],
            cold=t["cold"],
            **_step_fields(t),
        )
        for t in rec["turns"]
    )
    return Session(
        session_id=rec["id"], tenant=rec["tenant"], system_prompt=system, turns=turns, index=index, meta={"workload": name}
    )


def _turn_text(seed: int, t: dict[str, Any], r_text: Any, tokenizer: TextTokenizer, blocks: BlockTexts) -> str:
    if "content" in t:
        return t["content"]
    if "hash_ids" in t:
        # Blocks by id, as the trace's reader builds them: shared ids, shared prefixes.
        return blocks.text(seed, split_blocks(t["hash_ids"], t["tokens"], t["block_size"]), t["block_size"], tokenizer)
    return tokenizer.text(t["tokens"], r_text)


def iter_session_rows(path: str | Path) -> Iterator[TraceRow]:
    """The file's sessions one line at a time, in file order, each validated as it is read (the
    same errors as ``load_sessions_jsonl``), for a streamed replay (``workloads.streamed``).

    ``time_s`` is the line's ``arrival_s``, or None in a file without them; a file that has it on
    some lines only is an error naming the first line that differs from the first session's. The
    ids already read are kept (to name a repeated one): the one thing held per session.
    """
    path = Path(path)
    where = str(path)
    seen: dict[str, int] = {}
    timed: bool | None = None
    first_line = 0
    for lineno, line in enumerate(iter_text_lines(path, "session file"), start=1):
        if not line.strip():
            continue
        rec = _parse_line(line, where=f"{where} line {lineno}")
        if rec["id"] in seen:
            raise WorkloadError(
                f"{where} line {lineno}: id: {_short(rec['id'])} already used on line {seen[rec['id']]}; "
                "give every session a unique id"
            )
        seen[rec["id"]] = lineno
        has_time = "arrival_s" in rec
        if timed is None:
            timed, first_line = has_time, lineno
        elif has_time != timed:
            said = "has no arrival_s but" if timed else "has arrival_s but"
            raise WorkloadError(
                f"{where} line {lineno}: session {rec['id']!r} {said} line {first_line}'s "
                f"{'has' if timed else 'has not'}; give arrival_s on every line or on none"
            )
        yield TraceRow(lineno, rec["arrival_s"] if has_time else None, rec)
    if timed is None:
        raise WorkloadError(f"{where}: holds no sessions; give one JSON object per line")


def load_sessions_jsonl(path: str | Path) -> SessionFileWorkload:
    """Read and validate a session file; every error names ``file line N: key``."""
    path = Path(path)
    where = str(path)
    try:
        data = read_bytes(path)
    except OSError as e:
        reason = e.strerror or str(e)
        raise WorkloadError(
            f"{where}: cannot read the session file ({reason}); give a readable .jsonl file"
        ) from None
    try:
        text = data.decode("utf-8-sig")  # a leading BOM (Windows editors write one) is not content
    except UnicodeDecodeError:
        raise WorkloadError(f"{where}: not UTF-8 text; a session file is UTF-8 JSON lines") from None
    del data
    records: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for lineno, line in enumerate(io.StringIO(text, newline=None), start=1):
        if not line.strip():
            continue
        rec = _parse_line(line, where=f"{where} line {lineno}")
        if rec["id"] in seen:
            raise WorkloadError(
                f"{where} line {lineno}: id: {_short(rec['id'])} already used on line {seen[rec['id']]}; "
                "give every session a unique id"
            )
        seen[rec["id"]] = lineno
        records.append(rec)
    if not records:
        raise WorkloadError(f"{where}: holds no sessions; give one JSON object per line")
    return SessionFileWorkload(records, name=path.stem, source=where)


def _parse_line(line: str, *, where: str) -> dict[str, Any]:
    try:
        obj = json.loads(line.strip())
    except json.JSONDecodeError as e:
        raise WorkloadError(
            f"{where}: not valid JSON ({e.msg} at column {e.colno}); give one JSON object per line"
        ) from None
    if not isinstance(obj, dict):
        raise WorkloadError(f"{where}: {_short(obj)} is not a JSON object; give one session object per line")
    for key in obj:
        if key not in SESSION_KEYS:
            raise WorkloadError(f"{where}: {key}: unknown key; use one of {', '.join(SESSION_KEYS)}")
    if "id" not in obj:
        raise WorkloadError(f"{where}: id: missing; every session needs an id (a non-empty string)")
    sid = obj["id"]
    if not isinstance(sid, str) or not sid:
        raise WorkloadError(f"{where}: id: {_short(sid)} is not allowed; use a non-empty string")
    tenant = obj.get("tenant", DEFAULT_TENANT)
    if not isinstance(tenant, str) or not tenant:
        raise WorkloadError(f"{where}: tenant: {_short(tenant)} is not allowed; use a non-empty string")
    if "system_prompt" in obj and "system_prompt_tokens" in obj:
        raise WorkloadError(f"{where}: system_prompt_tokens: given with system_prompt; give one of the two")
    rec: dict[str, Any] = {"id": sid, "tenant": tenant}
    if "arrival_s" in obj:
        arrival = obj["arrival_s"]
        if isinstance(arrival, bool) or not isinstance(arrival, int | float) or not math.isfinite(arrival) or arrival < 0:
            raise WorkloadError(f"{where}: arrival_s: {_short(arrival)} is not allowed; use seconds >= 0")
        rec["arrival_s"] = float(arrival)
    if "system_prompt_tokens" in obj:
        where_key = f"{where}: system_prompt_tokens"
        rec["system_prompt_tokens"] = _count(obj["system_prompt_tokens"], where=where_key, at_least=0)
    else:
        rec["system_prompt"] = obj.get("system_prompt", "")
        if not isinstance(rec["system_prompt"], str):
            raise WorkloadError(
                f"{where}: system_prompt: {_short(rec['system_prompt'])} is not text; use a string"
            )
    if "turns" not in obj:
        raise WorkloadError(f"{where}: turns: missing; every session needs a non-empty list of turns")
    raw_turns = obj["turns"]
    if not isinstance(raw_turns, list) or not raw_turns:
        raise WorkloadError(
            f"{where}: turns: {_short(raw_turns)} is not allowed; use a non-empty list of turns"
        )
    rec["turns"] = [_parse_turn(t, i, where=where) for i, t in enumerate(raw_turns)]
    # The DAG's shape is checked now, with placeholder texts, so a bad file fails before any load.
    plan_turns([Turn("", 1, **_step_fields(t)) for t in rec["turns"]], where=f"{where}: session {sid}")
    return rec


def _step_fields(t: dict[str, Any]) -> dict[str, Any]:
    """The DAG fields of a parsed turn as ``Turn`` keyword arguments (none for a plain chain turn)."""
    out: dict[str, Any] = {}
    if "id" in t:
        out["step_id"] = t["id"]
    if "kind" in t:
        out["kind"] = t["kind"]
    if "parents" in t:
        out["parent_ids"] = tuple(t["parents"])
    if "tool_call" in t:
        out["tool_call"] = t["tool_call"]
    return out


def _parse_turn(obj: Any, i: int, *, where: str) -> dict[str, Any]:
    at = f"turns[{i}]"
    if not isinstance(obj, dict):
        raise WorkloadError(
            f'{where}: {at}: {_short(obj)} is not a JSON object; use {{"content", "max_tokens"}}'
        )
    for key in obj:
        if key not in TURN_KEYS:
            raise WorkloadError(f"{where}: {at}.{key}: unknown key; use one of {', '.join(TURN_KEYS)}")
    if ("content" in obj) == ("tokens" in obj):
        what = "both given" if "content" in obj else "missing"
        raise WorkloadError(
            f"{where}: {at}.content: {what}; give exactly one of content (text) or tokens (a count)"
        )
    if "content" in obj:
        text: dict[str, Any] = {"content": obj["content"]}
        if not isinstance(obj["content"], str):
            raise WorkloadError(f"{where}: {at}.content: {_short(obj['content'])} is not text; use a string")
    else:
        text = {"tokens": _count(obj["tokens"], where=f"{where}: {at}.tokens", at_least=1)}
    if "hash_ids" in obj or "block_size" in obj:
        text.update(_parse_hash_ids(obj, text.get("tokens"), where=f"{where}: {at}"))
    if "max_tokens" not in obj:
        raise WorkloadError(
            f"{where}: {at}.max_tokens: missing; every turn needs max_tokens (an integer >= 1)"
        )
    max_tokens = _count(obj["max_tokens"], where=f"{where}: {at}.max_tokens", at_least=1)
    think = obj.get("think_time", 0)
    try:
        think_s = parse_duration_s(think)
    except ValueError:
        raise WorkloadError(
            f'{where}: {at}.think_time: {_short(think)} is not a duration; use seconds >= 0 or e.g. "1500ms"'
        ) from None
    if i == 0 and think_s != 0:
        raise WorkloadError(
            f"{where}: {at}.think_time: {_short(think)} on the first turn; the first turn starts at the "
            "session's arrival, so leave it out or use 0"
        )
    role = obj.get("role", "user")
    if role not in ROLES:
        raise WorkloadError(
            f"{where}: {at}.role: {_short(role)} is not allowed; use one of {', '.join(ROLES)}"
        )
    cold = obj.get("cold", False)
    if not isinstance(cold, bool):
        raise WorkloadError(f"{where}: {at}.cold: {_short(cold)} is not allowed; use true or false")
    out = {**text, "max_tokens": max_tokens, "think_time": think_s, "role": role, "cold": cold}
    for key in ("id", "kind", "tool_call"):
        if key in obj:
            if not isinstance(obj[key], str) or not obj[key]:
                raise WorkloadError(f"{where}: {at}.{key}: {_short(obj[key])} is not allowed; use a non-empty string")
            out[key] = obj[key]
    if "parents" in obj:
        parents = obj["parents"]
        if not isinstance(parents, list) or not all(isinstance(p, str) and p for p in parents):
            raise WorkloadError(
                f"{where}: {at}.parents: {_short(parents)} is not allowed; use a list of step ids"
            )
        out["parents"] = parents
    return out


def _parse_hash_ids(obj: dict[str, Any], tokens: int | None, *, where: str) -> dict[str, Any]:
    """A turn's optional prefix blocks: ``hash_ids`` (one id per ``block_size`` tokens of ``tokens``)."""
    if "hash_ids" not in obj:
        raise WorkloadError(f"{where}.hash_ids: missing; block_size goes with hash_ids (one id per block)")
    if tokens is None:
        raise WorkloadError(f"{where}.hash_ids: given with content; hash_ids build the text of tokens, give tokens instead")
    if "block_size" not in obj:
        raise WorkloadError(f"{where}.block_size: missing; hash_ids need block_size (tokens per id)")
    block_size = _count(obj["block_size"], where=f"{where}.block_size", at_least=1)
    ids = obj["hash_ids"]
    if not isinstance(ids, list) or not ids:
        raise WorkloadError(f"{where}.hash_ids: {_short(ids)} is not allowed; use a non-empty list of integers >= 0")
    for h in ids:
        _count(h, where=f"{where}.hash_ids", at_least=0)
    want = blocks_needed(tokens, block_size)
    if len(ids) != want:
        raise WorkloadError(
            f"{where}.hash_ids: {len(ids)} blocks but tokens {tokens} needs {want} of {block_size}; "
            "give one id per block (the last may be partial)"
        )
    return {"hash_ids": list(ids), "block_size": block_size}


def _count(value: Any, *, where: str, at_least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < at_least:
        raise WorkloadError(f"{where}: {_short(value)} is not allowed; use an integer >= {at_least}")
    return value


def _short(value: Any) -> str:
    """A JSON value as it appears in the file, cut to keep the message on one short line."""
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 40 else text[:37] + "..."


def session_record(
    session: Session, *, include_text: bool = True, hash_ids: list[dict[str, Any] | None] | None = None
) -> dict[str, Any]:
    """The JSONL object of one session. Without text, counts replace texts (``tokens``), and a turn
    built from a trace's prefix blocks (``hash_ids[i]``: ``{"hash_ids", "block_size", "tokens"}``)
    keeps its block ids, so the replay rebuilds the same shared prefixes."""
    rec: dict[str, Any] = {"id": session.session_id, "tenant": session.tenant}
    if include_text:
        if session.system_prompt:
            rec["system_prompt"] = session.system_prompt
    else:
        rec["system_prompt_tokens"] = count_tokens(session.system_prompt)
    turns = []
    # A DAG session writes every step's id, kind and parents, so the replay keeps its structure;
    # a chain writes what it always did.
    plan = plan_turns(session.turns, where=f"session {session.session_id}")
    dag = plan.is_dag() or any(t.tool_call is not None for t in session.turns)
    for i, t in enumerate(session.turns):
        blocks = None if include_text or hash_ids is None else hash_ids[i]
        if blocks is not None:
            out: dict[str, Any] = {
                "tokens": blocks["tokens"], "hash_ids": list(blocks["hash_ids"]), "block_size": blocks["block_size"]
            }  # fmt: skip
        else:
            out = {"content": t.content} if include_text else {"tokens": count_tokens(t.content)}
        out["max_tokens"] = t.max_tokens
        if i > 0:
            out["think_time"] = t.think_time_s
        out["role"] = t.role
        if t.cold:
            out["cold"] = True
        if dag:
            step = plan.steps[i]
            out["id"] = step.step_id
            out["kind"] = step.kind
            out["parents"] = list(step.parent_ids)
            if t.tool_call is not None:
                out["tool_call"] = t.tool_call
        turns.append(out)
    rec["turns"] = turns
    return rec


def write_sessions_jsonl(
    workload: Workload, seed: int, n: int, path: str | Path, *, include_text: bool = True
) -> Path:
    """Write sessions ``0 .. n-1`` of ``workload`` under ``seed`` to ``path`` (atomically).

    Replaying the file (``load_sessions_jsonl``) gives the same sessions. With ``include_text=False``
    only token counts are written; replayed with the same seed, a synthetic spec's export still gives
    identical sessions (same text streams), and it is far smaller. A trace's turns built from prefix
    blocks (Mooncake's and Qwen-Bailian's ``hash_ids``) keep their ids and ``block_size``, so the
    replay shares the same prefixes as the trace.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise WorkloadError(f"export: n {n!r} is not allowed; use an integer >= 1")
    if workload.num_sessions is not None and n > workload.num_sessions:
        raise WorkloadError(
            f"{workload.source}: asked for {n} sessions but it holds {workload.num_sessions}; ask for fewer"
        )
    path = Path(path)
    offsets = workload.arrival_offsets()
    fd, tmp = _create_beside(path)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for k, session in enumerate(workload.sessions(seed, n)):
                blocks = None if include_text else getattr(workload, "turn_hash_ids", lambda _k: None)(k)
                rec = session_record(session, include_text=include_text, hash_ids=blocks)
                if offsets is not None:
                    rec["arrival_s"] = round(float(offsets[k]), 6)
                f.write(json.dumps(rec, ensure_ascii=False, separators=(",", ":")))
                f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _create_beside(path: Path) -> tuple[int, str]:
    """A new temporary file next to ``path`` with the mode a plain ``open`` gives (0666 less the
    umask: 0644 under 022), not ``mkstemp``'s 0600, so the exported file is as readable as any."""
    for _ in range(100):
        tmp = str(path.parent / f"{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"{path.parent}: cannot create a temporary file beside {path.name}")
