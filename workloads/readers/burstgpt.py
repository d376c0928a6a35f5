"""BurstGPT traces: CSV rows of arrival time, model, request sizes and log type.

Header (BurstGPT's published files; columns in any order, names in any case, extra columns
ignored)::

    Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
    5,ChatGPT,472,18,490,Conversation log

* ``Timestamp``: seconds from the trace's start; the replay starts at the earliest;
* ``Model`` (``ChatGPT``, ``GPT-4``) and ``Log Type`` (``Conversation log``, ``API log``): filtered
  by the ``model`` and ``log_type`` options (any case; several values joined by ``|``);
* ``Request tokens``: prompt tokens, synthetic text unique to the request (0 is sent as 1 token,
  counted as ``zero_request_rows``); ``Response tokens``: tokens generated, the turn's ``max_tokens``.

A row with ``Response tokens`` 0 is a failed request in BurstGPT: it is left out and counted
(``dropped.zero_response_tokens``), never replayed as a 1-token request. Each remaining row is a
one-turn session at its timestamp, in arrival order (ties keep file order).
"""

from __future__ import annotations

import csv
import itertools
import math
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from workloads.dataset import DatasetWorkload
from workloads.errors import WorkloadError
from workloads.readers.azure import _int
from workloads.readers.base import WorkloadReader, short, whole_number
from workloads.readers.stream import TraceRow, csv_header, iter_text_blocks, lines_of, require_columns
from workloads.spec import DEFAULT_TENANT
from workloads.text import BUILTIN, TextTokenizer

# lower-case column -> as BurstGPT writes it
COLUMNS = {
    "timestamp": "Timestamp",
    "model": "Model",
    "request tokens": "Request tokens",
    "response tokens": "Response tokens",
    "log type": "Log Type",
}


class BurstGPTReader(WorkloadReader):
    name = "burstgpt"
    description = "BurstGPT trace (CSV: Timestamp s, Model, Request tokens, Response tokens, Log Type), one request each"
    suffixes = (".csv",)
    options = {
        "model": "keep rows of this Model (any case; several joined by |), e.g. ChatGPT",
        "log_type": "keep rows of this Log Type (any case; several joined by |), e.g. Conversation log",
        "tenant": "tenant name of every session (default 'default')",
    }

    @classmethod
    def sniff(cls, path: Path, first: Any) -> bool:
        return isinstance(first, list) and {c.strip().lower() for c in first} >= {"request tokens", "response tokens"}

    def iter_rows(
        self,
        path: Path,
        options: Mapping[str, str],
        *,
        tokenizer: TextTokenizer = BUILTIN,
        dropped: dict[str, int] | None = None,
    ) -> Iterator[TraceRow]:
        """The rows kept, in file order, each validated as it is read; ``dropped`` counts the rows
        left out by reason (``workloads.readers.stream``)."""
        for _times, _last_line, rows in self.iter_row_blocks(path, options, tokenizer=tokenizer, dropped=dropped):
            yield from rows

    def iter_row_blocks(
        self,
        path: Path,
        options: Mapping[str, str],
        *,
        tokenizer: TextTokenizer = BUILTIN,
        dropped: dict[str, int] | None = None,
    ) -> Iterator[tuple[list[float], int, Iterable[TraceRow]]]:
        """``iter_rows``' rows a block of text at a time, with their times and the last one's line
        (as ``AzureReader.iter_row_blocks``: a plain block in one step, any other row by row)."""
        where = str(path)
        self.check_options(options, where)
        tenant = options.get("tenant", DEFAULT_TENANT) or DEFAULT_TENANT
        blocks = iter_text_blocks(path, "BurstGPT trace")
        try:
            header, rest = csv_header(blocks)
            require_columns(
                where, header, COLUMNS,
                "Timestamp, Model, Request tokens, Response tokens, Total tokens and Log Type", shown=COLUMNS,
            )  # fmt: skip
            if dropped is None:
                dropped = {}
            for key in ("model", "log_type", "zero_response_tokens"):
                dropped.setdefault(key, 0)
            lay = _Layout(
                where, path.stem, tenant, len(header), {c: header.index(c) for c in COLUMNS},
                _choices(options.get("model")), _choices(options.get("log_type")), dropped,
            )  # fmt: skip
            kept = 0
            lineno = 2  # of the block's first line
            for block in itertools.chain((rest,), blocks):
                if not block:
                    continue
                plain = _plain_block(block, lineno, lay)
                if plain is None:  # row by row, lazily: the rows before a fault are still handed out
                    for row in _careful_rows(block, lineno, lay):
                        kept += 1
                        yield [row[1]], row[0], (row,)
                elif plain[0]:
                    kept += len(plain[0])
                    yield plain
                lineno += block.count("\n") + (not block.endswith("\n"))
        finally:
            blocks.close()  # type: ignore[attr-defined]
        if not kept:
            left = ", ".join(f"{v} by {k}" for k, v in dropped.items() if v) or "the file has none"
            raise WorkloadError(
                f"{where}: no requests left to replay ({left} left out); check the model and log_type workload options"
            )

    def read(self, path: Path, options: Mapping[str, str], *, tokenizer: TextTokenizer = BUILTIN) -> DatasetWorkload:
        dropped: dict[str, int] = {}
        rows = sorted(self.iter_rows(path, options, dropped=dropped), key=lambda r: r.time_s)  # stable: ties keep file order
        t0 = rows[0].time_s
        zero_request = 0
        records = []
        for r in rows:
            zero_request += r.record.pop("request_tokens") == 0
            records.append(r.record)
        offsets = np.array([r.time_s - t0 for r in rows], dtype=np.float64)
        return DatasetWorkload(
            records,
            kind=self.name,
            name=path.stem,
            source=str(path),
            options=dict(options),
            offsets_s=offsets,
            stats={"dropped": {k: v for k, v in dropped.items() if v}, "zero_request_rows": zero_request},
            tokenizer=tokenizer,
        )


class _Layout(NamedTuple):
    """Where a trace's fields are, what is kept, and what its rows are built with."""

    where: str
    stem: str
    tenant: str
    width: int
    col: dict[str, int]
    keep_model: set[str] | None
    keep_log: set[str] | None
    dropped: dict[str, int]


def _plain_block(block: str, lineno: int, lay: _Layout) -> tuple[list[float], int, Iterator[TraceRow]] | None:
    """The kept rows' times, the last line and the kept rows of a block of whole lines (the first
    is line ``lineno``) parsed in one step, or None when the block is not plain (then
    ``_careful_rows`` reads it and names any fault). Its left-out rows are counted."""
    if '"' in block:
        return None
    text = block[:-1] if block.endswith("\n") else block
    n = text.count("\n") + 1
    width, col = lay.width, lay.col
    if text.count(",") != (width - 1) * n:  # a blank line, a short or a long row
        return None
    cells = text.replace("\n", ",").split(",")
    try:
        times = list(map(float, cells[col["timestamp"] :: width]))
        ins = list(map(int, cells[col["request tokens"] :: width]))
        outs = list(map(int, cells[col["response tokens"] :: width]))
    except ValueError:
        return None
    total = sum(times)
    if total - total != 0 or min(ins) < 0 or min(outs) < 0:  # an inf or a nan, a negative count
        return None
    kept: Iterable[int] = range(n)
    if lay.keep_model is not None:
        models, keep = cells[col["model"] :: width], lay.keep_model
        kept = [j for j in kept if models[j].strip().lower() in keep]
        lay.dropped["model"] += n - len(kept)
    if lay.keep_log is not None:
        logs, keep, before = cells[col["log type"] :: width], lay.keep_log, len(kept)  # type: ignore[arg-type]
        kept = [j for j in kept if logs[j].strip().lower() in keep]
        lay.dropped["log_type"] += before - len(kept)
    before = len(kept)  # type: ignore[arg-type]
    kept = [j for j in kept if outs[j]]
    lay.dropped["zero_response_tokens"] += before - len(kept)
    if not kept:
        return [], lineno + n - 1, ()
    stem, tenant = lay.stem, lay.tenant
    new = tuple.__new__  # TraceRow(...) without its Python-level __new__
    rows = (  # built as they are taken: a row dies young (see azure._plain_block)
        new(
            TraceRow,
            (
                lineno + j,
                times[j],
                {
                    "id": f"{stem}-L{lineno + j}",
                    "tenant": tenant,
                    "turns": [{"tokens": max(1, ins[j]), "max_tokens": outs[j], "role": "user"}],
                    "request_tokens": ins[j],
                },
            ),
        )
        for j in kept
    )
    return [times[j] for j in kept], lineno + kept[-1], rows


def _careful_rows(block: str, lineno: int, lay: _Layout) -> Iterator[TraceRow]:
    """A block's kept rows one by one, each checked field by field (the first is line ``lineno``)."""
    where, col, dropped, keep_model, keep_log = lay.where, lay.col, lay.dropped, lay.keep_model, lay.keep_log
    for k, row in enumerate(csv.reader(lines_of([block])), start=lineno):
        if not row or not any(cell.strip() for cell in row):
            continue
        at = f"{where} line {k}"
        if len(row) < lay.width:
            raise WorkloadError(f"{at}: {len(row)} columns, the header has {lay.width}; give every column")
        t = _seconds(row[col["timestamp"]], at=f"{at}: Timestamp")
        n_in = whole_number(_int(row[col["request tokens"]]), where=f"{at}: Request tokens", at_least=0)
        n_out = whole_number(_int(row[col["response tokens"]]), where=f"{at}: Response tokens", at_least=0)
        if keep_model is not None and row[col["model"]].strip().lower() not in keep_model:
            dropped["model"] += 1
            continue
        if keep_log is not None and row[col["log type"]].strip().lower() not in keep_log:
            dropped["log_type"] += 1
            continue
        if n_out == 0:
            dropped["zero_response_tokens"] += 1
            continue
        yield TraceRow(
            k,
            t,
            {
                "id": f"{lay.stem}-L{k}",
                "tenant": lay.tenant,
                "turns": [{"tokens": max(1, n_in), "max_tokens": n_out, "role": "user"}],
                "request_tokens": n_in,
            },
        )


def _choices(value: str | None) -> set[str] | None:
    if value is None:
        return None
    return {v.strip().lower() for v in value.split("|") if v.strip()}


def _seconds(cell: str, *, at: str) -> float:
    try:
        t = float(cell.strip())
    except ValueError:
        t = math.nan
    if not math.isfinite(t):
        raise WorkloadError(f"{at}: {short(cell.strip())} is not allowed; give seconds from the trace's start")
    return t
