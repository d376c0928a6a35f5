"""Azure LLM inference traces: CSV rows of arrival time and request sizes.

Header (any column order, names in any case, extra columns ignored)::

    TIMESTAMP,ContextTokens,GeneratedTokens
    2023-11-16 18:15:46.6805900,4808,10

* ``TIMESTAMP``: ISO datetime (Azure's 7 fractional digits are fine) or seconds; replay starts at
  the earliest;
* ``ContextTokens``: prompt tokens, built as synthetic text unique to the request (the trace says
  nothing about shared prefixes); ``GeneratedTokens``: tokens generated (0 is replayed as 1).

Each row is a one-turn session, in arrival order (ties keep file order).
"""

from __future__ import annotations

import csv
import itertools
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from workloads.dataset import DatasetWorkload
from workloads.errors import WorkloadError
from workloads.readers.base import WorkloadReader, whole_number
from workloads.readers.stream import (
    CsvTimes,
    TraceRow,
    csv_header,
    iter_text_blocks,
    lines_of,
    require_columns,
)
from workloads.spec import DEFAULT_TENANT
from workloads.text import BUILTIN, TextTokenizer

COLUMNS = ("timestamp", "contexttokens", "generatedtokens")


class AzureReader(WorkloadReader):
    name = "azure"
    description = "Azure LLM inference trace (CSV: TIMESTAMP, ContextTokens, GeneratedTokens), one request each"
    suffixes = (".csv",)
    options = {"tenant": "tenant name of every session (default 'default')"}

    @classmethod
    def sniff(cls, path: Path, first: Any) -> bool:
        return isinstance(first, list) and {c.strip().lower() for c in first} >= set(COLUMNS)

    def iter_rows(
        self, path: Path, options: Mapping[str, str], *, tokenizer: TextTokenizer = BUILTIN
    ) -> Iterator[TraceRow]:
        """The trace's rows in file order, each validated as it is read (``workloads.readers.stream``)."""
        for _times, _last_line, rows in self.iter_row_blocks(path, options, tokenizer=tokenizer):
            yield from rows

    def iter_row_blocks(
        self, path: Path, options: Mapping[str, str], *, tokenizer: TextTokenizer = BUILTIN
    ) -> Iterator[tuple[list[float], int, Iterable[TraceRow]]]:
        """``iter_rows``' rows a block of text at a time, with their times and the last one's line (a streamed pass checks
        their order so: one step per block, not per row).

        A block is parsed in one step when it is plain (no quotes, every row as wide as the
        header, whole numbers, times in one form: ``_plain_block``); any other block is read row by
        row (``_careful_rows``, a block of one row each), which names the file, line and field of a fault."""
        where = str(path)
        self.check_options(options, where)
        tenant = options.get("tenant", DEFAULT_TENANT) or DEFAULT_TENANT
        blocks = iter_text_blocks(path, "Azure trace")
        try:
            header, rest = csv_header(blocks)
            require_columns(where, header, COLUMNS, "TIMESTAMP, ContextTokens and GeneratedTokens")
            layout = _Layout(where, path.stem, tenant, len(header), *(header.index(c) for c in COLUMNS), CsvTimes(path))
            any_row = False
            lineno = 2  # of the block's first line
            for block in itertools.chain((rest,), blocks):
                if not block:
                    continue
                plain = _plain_block(block, lineno, layout)
                if plain is None:  # row by row, lazily: the rows before a fault are still handed out
                    for row in _careful_rows(block, lineno, layout):
                        any_row = True
                        yield [row[1]], row[0], (row,)
                elif plain[0]:
                    any_row = True
                    yield plain
                lineno += block.count("\n") + (not block.endswith("\n"))
        finally:
            blocks.close()  # type: ignore[attr-defined]
        if not any_row:
            raise WorkloadError(f"{where}: holds no requests; give one CSV row per request under the header")

    def read(self, path: Path, options: Mapping[str, str], *, tokenizer: TextTokenizer = BUILTIN) -> DatasetWorkload:
        rows = sorted(self.iter_rows(path, options), key=lambda r: r.time_s)  # stable: ties keep file order
        t0 = rows[0].time_s
        zero_context = 0
        records = []
        for r in rows:
            zero_context += r.record.pop("context_tokens") == 0
            records.append(r.record)
        offsets = np.array([r.time_s - t0 for r in rows], dtype=np.float64)
        return DatasetWorkload(
            records,
            kind=self.name,
            name=path.stem,
            source=str(path),
            options=dict(options),
            offsets_s=offsets,
            stats={"zero_context_rows": zero_context},
            tokenizer=tokenizer,
        )


class _Layout(NamedTuple):
    """Where a trace's fields are and what its rows are built with."""

    where: str
    stem: str
    tenant: str
    width: int
    i_time: int
    i_in: int
    i_out: int
    times: CsvTimes


def _row(lineno: int, t_s: float, n_in: int, n_out: int, stem: str, tenant: str) -> TraceRow:
    return TraceRow(
        lineno,
        t_s,
        {
            "id": f"{stem}-L{lineno}",
            "tenant": tenant,
            "turns": [{"tokens": n_in or 1, "max_tokens": n_out or 1, "role": "user"}],
            "context_tokens": n_in,
        },
    )


def _plain_block(block: str, lineno: int, lay: _Layout) -> tuple[list[float], int, Iterator[TraceRow]] | None:
    """The times, the last line and the rows of a block of whole lines (the first is line ``lineno``) parsed in one step, or
    None when the block is not plain (then ``_careful_rows`` reads it and names any fault)."""
    if '"' in block:
        return None
    text = block[:-1] if block.endswith("\n") else block
    n = text.count("\n") + 1
    width = lay.width
    if text.count(",") != (width - 1) * n:  # a blank line, a short or a long row
        return None
    cells = text.replace("\n", ",").split(",")
    try:
        ins = list(map(int, cells[lay.i_in :: width]))
        outs = list(map(int, cells[lay.i_out :: width]))
    except ValueError:
        return None
    if min(ins) < 0 or min(outs) < 0:
        return None
    secs = lay.times.block_seconds(lineno, cells[lay.i_time :: width])
    if secs is None:
        return None
    stem, tenant = lay.stem, lay.tenant
    new = tuple.__new__  # TraceRow(...) without its Python-level __new__: a third of a row's cost
    # Built as they are taken, not a list of the block's: a row then dies young, and the
    # collector never walks a block's worth of live records (which cost more than building them).
    return secs, lineno + n - 1, (
        new(
            TraceRow,
            (
                k,
                t,
                {
                    "id": f"{stem}-L{k}",
                    "tenant": tenant,
                    "turns": [{"tokens": a or 1, "max_tokens": b or 1, "role": "user"}],
                    "context_tokens": a,
                },
            ),
        )
        for k, t, a, b in zip(range(lineno, lineno + n), secs, ins, outs, strict=True)
    )


def _careful_rows(block: str, lineno: int, lay: _Layout) -> Iterator[TraceRow]:
    """A block's rows one by one, each checked field by field (the first is line ``lineno``)."""
    where, width, i_time, i_in, i_out, times = lay.where, lay.width, lay.i_time, lay.i_in, lay.i_out, lay.times
    for k, row in enumerate(csv.reader(lines_of([block])), start=lineno):
        if not row or not (row[0].strip() or any(cell.strip() for cell in row)):
            continue
        if len(row) < width:
            raise WorkloadError(f"{where} line {k}: {len(row)} columns, the header has {width}; give every column")
        try:  # the usual case in one step; anything else takes the checks that name the fault
            n_in, n_out = int(row[i_in]), int(row[i_out])
        except ValueError:
            n_in = n_out = -1
        if n_in < 0 or n_out < 0:
            at = f"{where} line {k}"
            n_in = whole_number(_int(row[i_in]), where=f"{at}: ContextTokens", at_least=0)
            n_out = whole_number(_int(row[i_out]), where=f"{at}: GeneratedTokens", at_least=0)
        yield _row(k, times.seconds(k, row[i_time].strip()), n_in, n_out, lay.stem, lay.tenant)


def _int(cell: str) -> Any:
    text = cell.strip()
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text
