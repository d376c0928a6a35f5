"""Qwen-Bailian usage traces (alibaba-edu/qwen-bailian-usagetraces-anon): requests linked into chats.

Line format (one request per line)::

    {"chat_id": 160, "parent_chat_id": 159, "timestamp": 62.5, "input_length": 400,
     "output_length": 80, "type": "text", "turn": 2, "hash_ids": [1089, 1090, ...]}

* ``timestamp``: arrival in **seconds** (any origin; the replay starts at the earliest);
* ``chat_id``: the request's id; ``parent_chat_id``: the request of the previous turn of the same
  conversation, ``-1`` (or absent) for a conversation's first request;
* ``input_length``: the whole prompt's tokens (history included); ``output_length``: tokens
  generated (0 is replayed as 1);
* ``hash_ids`` (optional): one id per block of ``block_size`` prompt tokens (option, default 16, as
  the published traces are cut), the last block possibly partial;
* ``type``, ``turn`` and other keys are kept out of the replay.

How chats become sessions (docs/workloads.md, "Qwen-Bailian traces"):

* A request with no parent starts a session at its timestamp; its prompt is built from its
  ``hash_ids`` blocks (shared across sessions, as Mooncake's), or is synthetic text of
  ``input_length`` tokens without them.
* A request whose parent is in the file is the next turn of its parent's session. The replay sends
  the session's history (prompts and the replies the server streams) plus a new message of
  ``input_length - (parent's input_length + parent's output_length)`` tokens, what the context
  grew by (at least 1: a context that did not grow is counted as ``context_not_grown``).
* Its think time is the gap from the parent's arrival to its own: the trace records no end times,
  so that is the nearest it allows to "previous reply's end to this arrival" (an upper bound;
  the replay sends the turn that long after the previous reply ended).
* A request whose parent is not in the file (the trace was cut) or whose parent already has an
  earlier child (a regenerated or edited answer) starts a session of its own with its whole prompt;
  they are counted as ``orphan_chats`` and ``branch_chats``.

Sessions are in arrival order of their first request (ties keep file order). A trace of 8 MiB or
more is read as a stream (``workloads.readers.bailian_stream``): its rows must be in time order,
and a turn more than ``chat_horizon`` after its parent's starts a session of its own.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from workloads.blocks import split_blocks
from workloads.dataset import DatasetWorkload
from workloads.errors import WorkloadError
from workloads.readers.bailian_stream import DEFAULT_HORIZON_S, iter_chat_rows
from workloads.readers.base import (
    WorkloadReader,
    iter_json_lines,
    open_text,
    option_duration,
    option_int,
    short,
    whole_number,
)
from workloads.readers.mooncake import check_hash_ids
from workloads.readers.stream import TraceRow
from workloads.spec import DEFAULT_TENANT
from workloads.text import BUILTIN, TextTokenizer

DEFAULT_BLOCK_SIZE = 16
REQUIRED = ("chat_id", "timestamp", "input_length", "output_length")
ROOT = "-1"


class BailianReader(WorkloadReader):
    name = "bailian"
    description = "Qwen-Bailian trace (chat_id, parent_chat_id, timestamp s, input_length, output_length, hash_ids)"
    suffixes = (".jsonl",)
    options = {
        "block_size": f"prompt tokens per hash id (default {DEFAULT_BLOCK_SIZE})",
        "tenant": "tenant name of every session (default 'default')",
        "chat_horizon": f"a streamed trace (8 MiB or more): a turn this long after its parent's starts a session "
        f"of its own (seconds or e.g. 10m; default {DEFAULT_HORIZON_S:g})",
    }

    @classmethod
    def sniff(cls, path: Path, first: Any) -> bool:
        return isinstance(first, dict) and ("chat_id" in first or "parent_chat_id" in first) and "turns" not in first

    @staticmethod
    def block_size(options: Mapping[str, str], where: str) -> int:
        """The ``block_size`` option: prompt tokens per hash id."""
        block_size = option_int(options, "block_size", DEFAULT_BLOCK_SIZE, where=where, at_least=1)
        assert block_size is not None
        return block_size

    def iter_rows(
        self, path: Path, options: Mapping[str, str], *, tokenizer: TextTokenizer = BUILTIN
    ) -> Iterator[TraceRow]:
        """One row per chat, in order of first rows, each handed out once complete: the file read
        as a stream, holding only the open chats (``workloads.readers.bailian_stream``)."""
        where = str(path)
        self.check_options(options, where)
        block_size = self.block_size(options, where)
        horizon_s = option_duration(options, "chat_horizon", DEFAULT_HORIZON_S, where=where)
        if not horizon_s > 0:
            raise WorkloadError(f"{where}: workload option chat_horizon={options['chat_horizon']!r} is not allowed; use a duration > 0")
        tenant = options.get("tenant", DEFAULT_TENANT) or DEFAULT_TENANT
        stem = path.stem
        return iter_chat_rows(
            path,
            parse_row=lambda obj, at: _row(obj, at, block_size),
            build_record=lambda chain: _chain_record(chain, stem=stem, tenant=tenant, block_size=block_size)[0],
            horizon_s=horizon_s,
        )

    def read(self, path: Path, options: Mapping[str, str], *, tokenizer: TextTokenizer = BUILTIN) -> DatasetWorkload:
        where = str(path)
        self.check_options(options, where)
        block_size = self.block_size(options, where)
        tenant = options.get("tenant", DEFAULT_TENANT) or DEFAULT_TENANT
        rows: list[dict[str, Any]] = []
        lines_of: dict[str, int] = {}
        for lineno, obj in iter_json_lines(path, open_text(path, "Qwen-Bailian trace")):
            row = _row(obj, f"{where} line {lineno}", block_size)
            if row["chat_id"] in lines_of:
                raise WorkloadError(
                    f"{where} line {lineno}: chat_id: {short(obj['chat_id'])} already used on line "
                    f"{lines_of[row['chat_id']]}; give every request a unique chat_id"
                )
            lines_of[row["chat_id"]] = lineno
            row["line"] = lineno
            rows.append(row)
        if not rows:
            raise WorkloadError(f"{where}: holds no requests; give one JSON object per line")
        rows.sort(key=lambda r: r["t"])  # stable: ties keep file order
        sessions: list[list[dict[str, Any]]] = []
        session_of: dict[str, list[dict[str, Any]]] = {}  # chat_id -> its session
        has_child: set[str] = set()
        orphans = branches = not_grown = 0
        for row in rows:
            parent = row["parent"]
            chain = session_of.get(parent) if parent != ROOT else None
            if parent != ROOT and chain is None:
                orphans += 1
            elif chain is not None and (parent in has_child or chain[-1]["chat_id"] != parent):
                branches += 1
                chain = None
            if chain is None:
                chain = [row]
                sessions.append(chain)
            else:
                has_child.add(parent)
                chain.append(row)
            session_of[row["chat_id"]] = chain
        records = []
        for chain in sessions:
            rec, chain_not_grown = _chain_record(chain, stem=path.stem, tenant=tenant, block_size=block_size)
            not_grown += chain_not_grown
            records.append(rec)
        # Prefix reuse of first turns as a prefix cache sees it: leading blocks an earlier one sent.
        seen: set[int] = set()
        reused = total = 0
        for rec in records:
            blocks = rec["turns"][0].get("blocks")
            if blocks is None:
                continue
            total += sum(n for _, n in blocks)
            for block_id, n in blocks:
                if block_id not in seen:
                    break
                reused += n
            seen.update(b for b, _ in blocks)
        t0 = sessions[0][0]["t"]
        offsets = np.array([c[0]["t"] - t0 for c in sessions], dtype=np.float64)
        stats = {
            "block_size": block_size,
            "unique_blocks": len(seen),
            "prefix_reuse": reused / total if total else 0.0,
            "requests": len(rows),
            "orphan_chats": orphans,
            "branch_chats": branches,
            "context_not_grown": not_grown,
        }
        return DatasetWorkload(
            records,
            kind=self.name,
            name=path.stem,
            source=where,
            options=dict(options),
            offsets_s=offsets,
            block_size=block_size,
            stats=stats,
            tokenizer=tokenizer,
        )


def _chain_record(
    chain: list[dict[str, Any]], *, stem: str, tenant: str, block_size: int
) -> tuple[dict[str, Any], int]:
    """The session record of a chat's rows (first to last), and how many of its turns did not grow
    the context."""
    root = chain[0]
    turns: list[dict[str, Any]] = [_first_turn(root, block_size)]
    not_grown = 0
    for prev, row in itertools.pairwise(chain):
        grown = row["n_in"] - (prev["n_in"] + prev["n_out"])
        not_grown += grown < 1
        turns.append(
            {
                "tokens": max(1, grown),
                "max_tokens": max(1, row["n_out"]),
                "think_time": row["t"] - prev["t"],
                "role": "user",
            }
        )
    return {"id": f"{stem}-c{root['chat_id']}", "tenant": tenant, "turns": turns}, not_grown


def _first_turn(row: dict[str, Any], block_size: int) -> dict[str, Any]:
    turn: dict[str, Any] = {"max_tokens": max(1, row["n_out"]), "role": "user"}
    if row["hash_ids"] is not None:
        turn["blocks"] = split_blocks(row["hash_ids"], row["n_in"], block_size)
    else:
        turn["tokens"] = row["n_in"]
    return turn


def _chat_id(value: Any, *, at: str) -> str:
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int | str) or value == "":
        raise WorkloadError(f"{at}: {short(value)} is not allowed; give an integer or a non-empty string")
    return str(value)


def _row(obj: Any, at: str, block_size: int) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise WorkloadError(f"{at}: {short(obj)} is not a JSON object; give {{{', '.join(REQUIRED)}, ...}}")
    for key in REQUIRED:
        if key not in obj:
            raise WorkloadError(f"{at}: {key}: missing; every request needs {', '.join(REQUIRED)}")
    chat_id = _chat_id(obj["chat_id"], at=f"{at}: chat_id")
    parent_raw = obj.get("parent_chat_id", -1)
    parent = ROOT if parent_raw is None else _chat_id(parent_raw, at=f"{at}: parent_chat_id")
    if parent == chat_id:
        raise WorkloadError(f"{at}: parent_chat_id: {short(parent_raw)} is the request's own chat_id; use -1 for a first turn")
    ts = obj["timestamp"]
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts):
        raise WorkloadError(f"{at}: timestamp: {short(ts)} is not allowed; give a number of seconds")
    n_in = whole_number(obj["input_length"], where=f"{at}: input_length", at_least=1)
    n_out = whole_number(obj["output_length"], where=f"{at}: output_length", at_least=0)
    ids = None
    if obj.get("hash_ids") is not None:
        hash_ids = obj["hash_ids"]
        if not isinstance(hash_ids, list) or not hash_ids:
            raise WorkloadError(f"{at}: hash_ids: {short(hash_ids)} is not allowed; give a non-empty list of integers")
        ids = [whole_number(h, where=f"{at}: hash_ids", at_least=0) for h in hash_ids]
        check_hash_ids(ids, n_in, block_size, at=at)
    return {"chat_id": chat_id, "parent": parent, "t": float(ts), "n_in": n_in, "n_out": n_out, "hash_ids": ids}
