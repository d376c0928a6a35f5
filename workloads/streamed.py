"""``StreamedTraceWorkload``: a large trace replayed as it is read, never held whole in memory.

A file whose sessions are its rows (Azure, BurstGPT, Mooncake traces, ShareGPT conversations,
loadgen's session files, and a Qwen-Bailian trace's chats: ``WorkloadReader.iter_rows``) is read
row by row each time a pass needs it: the master's count of planned sessions, each worker's share
of the arrivals. Memory is one block of text and the sessions in flight (and a Bailian trace's
open chats), whatever the file's size.

What a whole-file read gives, it keeps: session k is the k-th arrival and its record is the one
the whole-file reader builds. For a trace that holds because such a file must be in time order
(published traces are): rows are taken in file order, and a row earlier than the one before it
is a one-line error naming its line (the whole-file reader sorts instead, which needs the whole
file). A dataset without times is in file order either way. A Qwen-Bailian trace's chats are
linked within a horizon (``workloads.readers.bailian_stream``): a turn later than that after its
parent's starts a session of its own, where the whole-file reader links any gap.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import operator
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from workloads.blocks import BlockTexts
from workloads.dataset import RecordSessions
from workloads.errors import WorkloadError
from workloads.model import Session
from workloads.readers.base import WorkloadReader
from workloads.readers.stream import TraceRow
from workloads.spec import DEFAULT_TENANT
from workloads.text import BUILTIN, TextTokenizer
from workloads.workload import Workload, check_seed_index

# Files at least this large are streamed when the reader can (smaller ones are read whole: cheap,
# and they may be in any order). A 10-million-row Azure trace is ~400 MB; 8 MiB is ~200k rows.
STREAM_MIN_BYTES = 8 * 1024 * 1024
RECENT_ROWS = 4096  # records session() keeps behind its read position


class StreamedTraceWorkload(RecordSessions, Workload):
    """The sessions of a time-ordered trace file, read row by row (see the module docstring).

    ``rows()`` is the one way in: every pass re-reads the file. ``session(seed, index)`` reads up to
    row ``index`` (fine for a few, slow for many); replays go through ``rows()``
    (``loadgen.engine.plan_stream``) and build each session with ``record_session``.
    """

    def __init__(
        self,
        reader: WorkloadReader,
        path: Path,
        options: dict[str, str],
        *,
        tokenizer: TextTokenizer = BUILTIN,
    ) -> None:
        self._reader = reader
        self._path = path
        self.kind = reader.name
        self.name = path.stem
        self.source = str(path)
        self.options = dict(options)
        self.tokenizer = tokenizer
        self.block_size = getattr(reader, "block_size", None) and reader.block_size(options, self.source)
        self._blocks = BlockTexts()
        self.stats: dict[str, Any] = {"streamed": True}
        first = self._first_row()
        self._timed = first.time_s is not None
        self._tenants = (first.record.get("tenant") or options.get("tenant") or DEFAULT_TENANT,)
        self._count: int | None = None
        self._fingerprint: str | None = None
        self._cursor: Iterator[TraceRow] | None = None  # session(): the rows read on from here
        self._cursor_next = 0
        self._recent: OrderedDict[int, dict[str, Any]] = OrderedDict()
        # session(): a second reader for an agent that fell behind the kept rows, so that it does
        # not send the leading reader (and every other agent) back to the start.
        self._behind: Iterator[TraceRow] | None = None
        self._behind_next = 0
        # A reader whose records are not dataset records builds its own sessions (session files).
        self._build_session = getattr(reader, "session_from_record", None)

    # Sessions come from rows() in order; session(seed, index) reads on from the last one asked.
    streams_sessions = True

    def _first_row(self) -> TraceRow:
        rows = self._reader.iter_rows(self._path, self.options, tokenizer=self.tokenizer)
        try:
            return next(rows)  # the header and the first row are checked before anything is planned
        finally:
            rows.close()  # type: ignore[attr-defined]

    @property
    def path(self) -> Path:
        return self._path

    def rows(self) -> Iterator[TraceRow]:
        """Every row, in file order, validated as read; a row earlier than the one before it (in a
        timed trace) is a one-line error: a streamed trace is replayed in file order."""
        blocks = getattr(self._reader, "iter_row_blocks", None)
        if blocks is not None:
            yield from self._block_rows(blocks(self._path, self.options, tokenizer=self.tokenizer))
            return
        prev_t = -float("inf")
        prev_line = 0
        for row in self._reader.iter_rows(self._path, self.options, tokenizer=self.tokenizer):
            t = row.time_s
            if t is not None:
                if t < prev_t:
                    self._out_of_order(row, prev_t, prev_line)
                prev_t, prev_line = t, row.lineno
            yield row

    def _block_rows(self, blocks: Iterator[tuple[list[float], int, Iterable[TraceRow]]]) -> Iterator[TraceRow]:
        """The rows of a reader's blocks (``iter_row_blocks``: a block's times, its last line and its
        rows, every one timed), their order checked a block at a time; a block out of order is checked row by
        row, so the rows before the fault are still handed out and the error names its line."""
        prev_t = -float("inf")
        prev_line = 0
        for times, last_line, rows in blocks:
            if not times:
                continue
            if times[0] < prev_t or not all(map(operator.le, times, itertools.islice(times, 1, None))):
                for row in rows:
                    if row.time_s < prev_t:
                        self._out_of_order(row, prev_t, prev_line)
                    prev_t, prev_line = row.time_s, row.lineno
                    yield row
                continue
            prev_t, prev_line = times[-1], last_line
            yield from rows
    def _out_of_order(self, row: TraceRow, prev_t: float, prev_line: int) -> NoReturn:
        raise WorkloadError(
            f"{self.source} line {row.lineno}: timestamp is {prev_t - row.time_s:g} s before line {prev_line}'s; "
            f"a trace of {STREAM_MIN_BYTES // 2**20} MiB or more is replayed as it is read and must be "
            "in time order: sort its rows by time"
        )

    # -- Workload ------------------------------------------------------------------------------
    @property
    def num_sessions(self) -> int:
        """Every row, counted by one pass over the file (kept once counted)."""
        if self._count is None:
            self._count = sum(1 for _ in self.rows())
        return self._count

    def sessions_available(self, at_most: int | None = None) -> int:
        if self._count is not None or at_most is None:
            return self.num_sessions
        n = 0
        for _ in self.rows():
            n += 1
            if n >= at_most:
                break
        return n

    def has_arrival_times(self) -> bool:
        return self._timed

    @property
    def tenants(self) -> tuple[str, ...]:
        return self._tenants

    def arrival_offsets(self) -> np.ndarray | None:
        """Every row's offset from the first (one pass, one float per row: not for replays, which
        take them row by row through ``rows()``)."""
        if not self._timed:
            return None
        times = np.fromiter((r.time_s for r in self.rows()), dtype=np.float64)
        return times - times[0] if len(times) else times

    def session(self, seed: int, index: int) -> Any:
        """Session ``index``, read on from the last one asked for: agents of a closed loop ask in
        nearly increasing order, so the file is read about once (the last ``RECENT_ROWS`` rows
        are kept; an index before them is read by a second reader, from the start if it is behind
        that one too). An index past the file's end, once the end is known, is refused at once."""
        check_seed_index(seed, index, self._count, where=self.source)
        rec = self._recent.get(index)
        if rec is None and index < self._cursor_next - RECENT_ROWS:
            return self.record_session(seed, index, self._read_behind(index))
        if rec is None:
            if self._cursor is None:
                self._cursor, self._cursor_next = self.rows(), 0
                self._recent.clear()
            while self._cursor_next <= index:
                row = next(self._cursor, None)
                if row is None:  # past the last row: the file holds _cursor_next sessions
                    self._count = self._cursor_next
                    self._cursor = None
                    check_seed_index(seed, index, self._count, where=self.source)
                self._recent[self._cursor_next] = row.record  # type: ignore[union-attr]
                self._cursor_next += 1
                if len(self._recent) > RECENT_ROWS:
                    self._recent.popitem(last=False)
            rec = self._recent[index]
        return self.record_session(seed, index, rec)

    def _read_behind(self, index: int) -> dict[str, Any]:
        """Row ``index``'s record, for an agent behind the kept rows (the second reader)."""
        if self._behind is None or index < self._behind_next:
            self._behind, self._behind_next = self.rows(), 0
        for row in self._behind:
            self._behind_next += 1
            if self._behind_next > index:
                return row.record
        raise AssertionError(f"row {index} is before rows already read, but the file ended")  # pragma: no cover

    def record_session(self, seed: int, index: int, rec: dict[str, Any]) -> Session:
        """Session ``index`` for ``seed`` built from its row's record."""
        if self._build_session is not None:
            return self._build_session(rec, seed, index, name=self.name, tokenizer=self.tokenizer, blocks=self._blocks)
        return super().record_session(seed, index, rec)

    def fingerprint(self) -> str:
        """sha256 over the reader, its options, the tokenizer and the file's bytes (one pass in C;
        a whole-file read hashes its parsed records instead)."""
        if self._fingerprint is None:
            h = hashlib.sha256(f"streamed:{self.kind}:1\n".encode())
            h.update(json.dumps(self.options, sort_keys=True, default=str).encode())
            h.update(json.dumps(self.tokenizer.describe(), sort_keys=True).encode())
            with open(self._path, "rb") as f:
                while block := f.read(1 << 20):
                    h.update(block)
            self._fingerprint = h.hexdigest()
        return self._fingerprint

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "source": self.source,
            "fingerprint": self.fingerprint(),
            "num_sessions": self._count,
            "options": self.options,
            "timestamps": self._timed,
            "streamed": True,
        }


def known_fingerprint(workload: Workload) -> str | None:
    """``workload.fingerprint()``, or None for a streamed trace whose bytes are not hashed yet
    (a run hashes them in a thread, not before its start)."""
    if isinstance(workload, StreamedTraceWorkload) and workload._fingerprint is None:
        return None
    return workload.fingerprint()


def should_stream(reader: WorkloadReader, path: Path) -> bool:
    """Whether ``path`` is replayed as it is read: the reader iterates rows and the file is large."""
    try:
        size = path.stat().st_size
    except OSError:
        return False
    return reader.streams_rows and size >= STREAM_MIN_BYTES
