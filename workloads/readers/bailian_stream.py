"""A Qwen-Bailian trace's chats read as a stream: sessions from time-ordered rows, only open chats held.

A chat's turns are rows linked by ``parent_chat_id``, later in the file than their parent. Read
row by row, each row either starts a chat or continues an open one (``workloads.readers.bailian``
says how turns are built). A chat's session is handed out complete, once no later turn can join
it: when the rows read have passed its last turn's time by ``horizon_s`` (a turn that late starts a
session of its own, an orphan, as if the trace were cut there), or at the file's end. Sessions
come out in order of their first rows, as the whole-file reader orders them.

So the reader runs ahead of the replay by the chat's span plus the horizon in trace time, and
holds the chats that started in that window: their rows, and their chat ids (a repeated chat_id
is named while the first one's chat is held; a chat_id reused after that is not seen).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from workloads.errors import WorkloadError
from workloads.readers.base import iter_json_lines, short
from workloads.readers.stream import TraceRow, iter_text_lines

DEFAULT_HORIZON_S = 1800.0  # 30 min: a turn that much after its parent's is a new session
STREAM_ORDER_HINT = "a trace of 8 MiB or more is replayed as it is read and must be in time order: sort its rows by time"


def iter_chat_rows(
    path: Path,
    *,
    parse_row: Any,
    build_record: Any,
    horizon_s: float = DEFAULT_HORIZON_S,
) -> Iterator[TraceRow]:
    """One ``TraceRow`` per chat (its first row's line and time, the session record
    ``build_record(chain)`` makes of its rows), in order of first rows; ``parse_row(obj, at)``
    validates a line's object into a row dict (``chat_id``, ``parent``, ``t``, ...)."""
    where = str(path)
    open_chats: OrderedDict[int, list[dict[str, Any]]] = OrderedDict()  # by first row: the chat's rows
    chat_of: dict[str, int] = {}  # chat_id of a held row -> its chat's key
    line_of: dict[str, int] = {}
    prev_t, prev_line = -float("inf"), 0
    any_row = False

    def close_up_to(t: float) -> Iterator[TraceRow]:
        """Hand out the chats at the front that no row at ``t`` or later can continue."""
        while open_chats:
            key, chain = next(iter(open_chats.items()))
            if t - chain[-1]["t"] <= horizon_s:
                return
            del open_chats[key]
            for row in chain:
                chat_of.pop(row["chat_id"], None)
                line_of.pop(row["chat_id"], None)
            yield TraceRow(chain[0]["line"], chain[0]["t"], build_record(chain))

    for lineno, obj in iter_json_lines(where, iter_text_lines(path, "Qwen-Bailian trace")):
        row = parse_row(obj, f"{where} line {lineno}")
        t = row["t"]
        if t < prev_t:
            raise WorkloadError(
                f"{where} line {lineno}: timestamp is {prev_t - t:g} s before line {prev_line}'s; {STREAM_ORDER_HINT}"
            )
        prev_t, prev_line = t, lineno
        cid = row["chat_id"]
        if cid in line_of:
            raise WorkloadError(
                f"{where} line {lineno}: chat_id: {short(obj['chat_id'])} already used on line "
                f"{line_of[cid]}; give every request a unique chat_id"
            )
        row["line"] = lineno
        any_row = True
        yield from close_up_to(t)
        parent = row["parent"]
        key = chat_of.get(parent)
        chain = open_chats.get(key) if key is not None else None
        if chain is not None and (chain[-1]["chat_id"] != parent or t - chain[-1]["t"] > horizon_s):
            chain = None  # a branch (the parent has a later turn already), or past the horizon
        if chain is None:
            key = lineno
            open_chats[key] = chain = []
        chain.append(row)
        chat_of[cid] = key  # type: ignore[assignment]
        line_of[cid] = lineno
    if not any_row:
        raise WorkloadError(f"{where}: holds no requests; give one JSON object per line")
    yield from close_up_to(float("inf"))
