"""Mooncake traces: one request per line, with arrival time, sizes and prefix-block hashes.

Line format (Mooncake's published traces)::

    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48, ...]}

* ``timestamp``: arrival in milliseconds (any origin; replay starts at the earliest);
* ``input_length``: prompt tokens; ``output_length``: tokens generated (0 is replayed as 1);
* ``hash_ids``: one id per block of ``block_size`` prompt tokens (option, default 512), the last
  block possibly partial. Requests that share leading ids share the same prompt prefix: block b's
  text depends only on (seed, b), so prefix caches and cache-aware routers see the trace's reuse.

A line without ``session_id`` is a one-turn session (Mooncake's own traces: their reuse lives in
the shared blocks). Lines with a ``session_id`` (AIPerf's multi-turn ``mooncake_trace``) are the
turns of one session, in file order, and must be contiguous (a streamed trace is read once, row
by row; an id seen again after another session's lines is a one-line error):

* the session is named by its ``session_id``; the first line's ``timestamp`` is its arrival; a follow-up's ``delay`` (ms) is its
  think time, or, without ``delay``, the gap between its ``timestamp`` and the line before's;
* each line's ``input_length``/``hash_ids`` are **that turn's new message**, as AIPerf replays them
  (its default context mode, ``deltas_without_responses``): the conversation so far (earlier
  messages and the live replies) is sent before it, so a follow-up's ids continue the chain where
  the turn before left off instead of repeating its prefix.

Sessions are in arrival order; ties keep file order.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from workloads.blocks import blocks_needed, split_blocks
from workloads.dataset import DatasetWorkload
from workloads.errors import WorkloadError
from workloads.readers.base import WorkloadReader, iter_json_lines, option_int, short, whole_number
from workloads.readers.stream import TraceRow, iter_text_lines
from workloads.spec import DEFAULT_TENANT
from workloads.text import BUILTIN, TextTokenizer

DEFAULT_BLOCK_SIZE = 512
FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
# Keys that make a line another format's: Qwen-Bailian's chat links, a session file's turns.
NOT_MOONCAKE = ("chat_id", "parent_chat_id", "turns")


class MooncakeReader(WorkloadReader):
    name = "mooncake"
    description = "Mooncake trace (timestamp ms, input_length, output_length, hash_ids; session_id, delay for multi-turn)"
    suffixes = (".jsonl",)
    options = {
        "block_size": f"prompt tokens per hash id (default {DEFAULT_BLOCK_SIZE})",
        "tenant": "tenant name of every session (default 'default')",
    }

    @classmethod
    def sniff(cls, path: Path, first: Any) -> bool:
        if not isinstance(first, dict) or any(k in first for k in NOT_MOONCAKE):
            return False
        if "hash_ids" in first and "input_length" in first:
            return True
        # AIPerf's rows without hash_ids
        return "output_length" in first and ("input_length" in first or "text_input" in first)

    def iter_rows(
        self, path: Path, options: Mapping[str, str], *, tokenizer: TextTokenizer = BUILTIN
    ) -> Iterator[TraceRow]:
        """The trace's sessions in file order (a row per line, or per run of lines with one
        ``session_id``), each validated as it is read (``workloads.readers.stream``)."""
        where = str(path)
        self.check_options(options, where)
        block_size = self.block_size(options, where)
        tenant = options.get("tenant", DEFAULT_TENANT) or DEFAULT_TENANT
        stem = path.stem
        timed: int | None = None  # the first session's line: with or without a timestamp
        open_row: TraceRow | None = None  # the session whose follow-ups may come next
        open_key: str | None = None
        prev_t_s: float | None = None  # the open session's last line's timestamp
        closed: set[str] = set()  # session ids already handed out: their lines must be contiguous
        for lineno, obj in iter_json_lines(path, iter_text_lines(path, "Mooncake trace")):
            at = f"{where} line {lineno}"
            line = _row(obj, at, block_size)
            if line.session_key is not None and line.session_key == open_key:
                assert open_row is not None
                line.turn["think_time"] = _think_time_s(line, prev_t_s, at)
                open_row.record["turns"].append(line.turn)
                prev_t_s = line.t_s if line.t_s is not None else prev_t_s
                continue
            if line.session_key is not None and line.session_key in closed:
                raise WorkloadError(
                    f"{at}: session_id {short(line.session_key)}: its lines stop before this one; "
                    "give each session's lines one after another"
                )
            if open_row is not None:
                yield open_row
            has_ts = line.t_s is not None
            if timed is None:
                timed = lineno if has_ts else -lineno
            elif (timed > 0) != has_ts:
                first_line = abs(timed)
                raise WorkloadError(
                    f"{at}: timestamp: {'given' if has_ts else 'missing'} but line {first_line} has "
                    f"{'one' if timed > 0 else 'none'}; give timestamp on every line or on none "
                    "(a session's follow-ups may give delay instead)"
                )
            if line.delay_s is not None and line.session_key is not None:
                raise WorkloadError(
                    f"{at}: delay: given on session {short(line.session_key)}'s first line; "
                    "its arrival is its timestamp, delay is for the follow-ups"
                )
            session_id = line.session_key if line.session_key is not None else f"{stem}-L{lineno}"
            rec: dict[str, Any] = {"turns": [line.turn], "id": session_id, "tenant": tenant}
            open_row = TraceRow(lineno, line.t_s, rec)
            open_key, prev_t_s = line.session_key, line.t_s
            if open_key is not None:
                closed.add(open_key)
        if open_row is None:
            raise WorkloadError(f"{where}: holds no requests; give one JSON object per line")
        yield open_row

    @staticmethod
    def block_size(options: Mapping[str, str], where: str) -> int:
        """The ``block_size`` option: prompt tokens per hash id."""
        block_size = option_int(options, "block_size", DEFAULT_BLOCK_SIZE, where=where, at_least=1)
        assert block_size is not None
        return block_size

    def read(self, path: Path, options: Mapping[str, str], *, tokenizer: TextTokenizer = BUILTIN) -> DatasetWorkload:
        rows = sorted(self.iter_rows(path, options, tokenizer=tokenizer), key=lambda r: r.time_s or 0.0)  # stable: ties keep file order
        block_size = self.block_size(options, str(path))
        timed = rows[0].time_s is not None
        t0 = rows[0].time_s or 0.0
        records = []
        seen: set[int] = set()
        reused_tokens = total_tokens = 0
        for row in rows:
            rec = row.record
            records.append(rec)
            # Prefix reuse as a prefix cache sees it: leading blocks already sent by an earlier request.
            for t in rec["turns"]:
                blocks = t.get("blocks")
                if blocks is None:
                    total_tokens += t["tokens"] if "tokens" in t else tokenizer.count(t["content"])
                    continue
                total_tokens += sum(n for _, n in blocks)
                for block_id, n in blocks:
                    if block_id not in seen:
                        break
                    reused_tokens += n
                seen.update(b for b, _ in blocks)
        offsets = np.array([(r.time_s or 0.0) - t0 for r in rows], dtype=np.float64) if timed else None
        stats: dict[str, Any] = {"block_size": block_size}
        if seen:  # rows without hash_ids (AIPerf's) say nothing about reuse
            stats["unique_blocks"] = len(seen)
            stats["prefix_reuse"] = reused_tokens / total_tokens if total_tokens else 0.0
        return DatasetWorkload(
            records,
            kind=self.name,
            name=path.stem,
            source=str(path),
            options=dict(options),
            offsets_s=offsets,
            block_size=block_size,
            stats=stats,
            tokenizer=tokenizer,
        )


class _Line(NamedTuple):
    """One line: its timestamp and delay (seconds, when given), its session key, and its turn."""

    t_s: float | None
    delay_s: float | None
    session_key: str | None
    turn: dict[str, Any]


def _ms(obj: dict[str, Any], key: str, at: str) -> float | None:
    if key not in obj:
        return None
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or (key == "delay" and v < 0):
        raise WorkloadError(f"{at}: {key}: {short(v)} is not allowed; give a number of milliseconds")
    return float(v) / 1000.0


def _think_time_s(line: _Line, prev_t_s: float | None, at: str) -> float:
    """A follow-up's think time: its ``delay``, else the gap since the line before's timestamp."""
    if line.delay_s is not None:
        return line.delay_s
    if line.t_s is None or prev_t_s is None:
        return 0.0
    if line.t_s < prev_t_s:
        raise WorkloadError(f"{at}: timestamp: earlier than the session's line before; give its turns in time order")
    return line.t_s - prev_t_s


def _session_key(obj: dict[str, Any], at: str) -> str | None:
    if obj.get("session_id") is None:
        return None
    key = obj["session_id"]
    if isinstance(key, bool) or not isinstance(key, str | int) or key == "":
        raise WorkloadError(f"{at}: session_id: {short(key)} is not allowed; give a non-empty string")
    return str(key)


def _row(obj: Any, at: str, block_size: int) -> _Line:
    if not isinstance(obj, dict):
        raise WorkloadError(f"{at}: {short(obj)} is not a JSON object; give {{{', '.join(FIELDS)}}}")
    if "output_length" not in obj:
        raise WorkloadError(f"{at}: output_length: missing; every request needs output_length (tokens generated)")
    t_s = _ms(obj, "timestamp", at)
    delay_s = _ms(obj, "delay", at)
    key = _session_key(obj, at)
    if delay_s is not None and key is None:
        raise WorkloadError(f"{at}: delay: given without session_id; delay is a follow-up turn's wait, give session_id")
    n_out = whole_number(obj["output_length"], where=f"{at}: output_length", at_least=0)
    if "text_input" in obj:
        prompt = obj["text_input"]
        if not isinstance(prompt, str) or not prompt:
            raise WorkloadError(f"{at}: text_input: {short(prompt)} is not allowed; give the prompt as a non-empty string")
        return _Line(t_s, delay_s, key, {"content": prompt, "max_tokens": max(1, n_out), "role": "user"})
    if "input_length" not in obj:
        raise WorkloadError(f"{at}: input_length: missing; give input_length or text_input")
    n_in = whole_number(obj["input_length"], where=f"{at}: input_length", at_least=1)
    if "hash_ids" not in obj:
        return _Line(t_s, delay_s, key, {"tokens": n_in, "max_tokens": max(1, n_out), "role": "user"})
    hash_ids = obj["hash_ids"]
    if not isinstance(hash_ids, list) or not hash_ids:
        raise WorkloadError(f"{at}: hash_ids: {short(hash_ids)} is not allowed; give a non-empty list of integers")
    ids = [whole_number(h, where=f"{at}: hash_ids", at_least=0) for h in hash_ids]
    check_hash_ids(ids, n_in, block_size, at=at)
    turn = {"blocks": split_blocks(ids, n_in, block_size), "max_tokens": max(1, n_out), "role": "user"}
    return _Line(t_s, delay_s, key, turn)


def check_hash_ids(ids: list[int], n_in: int, block_size: int, *, at: str) -> None:
    """One id per block of ``block_size`` tokens (the last may be partial), or a one-line error."""
    want = blocks_needed(n_in, block_size)
    if len(ids) != want:
        raise WorkloadError(
            f"{at}: hash_ids: {len(ids)} blocks but input_length {n_in} needs {want} of {block_size} tokens; "
            "check the block_size workload option"
        )
