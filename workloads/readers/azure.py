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
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from workloads.dataset import DatasetWorkload
from workloads.errors import WorkloadError
from workloads.readers.base import WorkloadReader, whole_number
from workloads.readers.stream import CsvTimes, TraceRow, iter_text_lines
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
        where = str(path)
        self.check_options(options, where)
        tenant = options.get("tenant", DEFAULT_TENANT) or DEFAULT_TENANT
        reader = csv.reader(iter_text_lines(path, "Azure trace"))
        header = [h.strip().lower() for h in next(reader, None) or []]
        missing = [c for c in COLUMNS if c not in header]
        if missing:
            found = ", ".join(header)[:60] or "nothing"
            raise WorkloadError(
                f"{where} line 1: no {missing[0]} column (found {found}); "
                "give a CSV with TIMESTAMP, ContextTokens and GeneratedTokens"
            )
        i_time, i_in, i_out = (header.index(c) for c in COLUMNS)
        width = len(header)
        times = CsvTimes(path)
        stem = path.stem
        any_row = False
        for lineno, row in enumerate(reader, start=2):
            if not row or not (row[0].strip() or any(cell.strip() for cell in row)):
                continue
            if len(row) < width:
                raise WorkloadError(f"{where} line {lineno}: {len(row)} columns, the header has {width}; give every column")
            try:  # the usual case in one step; anything else takes the checks that name the fault
                n_in, n_out = int(row[i_in]), int(row[i_out])
            except ValueError:
                n_in = n_out = -1
            if n_in < 0 or n_out < 0:
                at = f"{where} line {lineno}"
                n_in = whole_number(_int(row[i_in]), where=f"{at}: ContextTokens", at_least=0)
                n_out = whole_number(_int(row[i_out]), where=f"{at}: GeneratedTokens", at_least=0)
            t_s = times.seconds(lineno, row[i_time].strip())
            any_row = True
            yield TraceRow(
                lineno,
                t_s,
                {
                    "id": f"{stem}-L{lineno}",
                    "tenant": tenant,
                    "turns": [{"tokens": n_in or 1, "max_tokens": n_out or 1, "role": "user"}],
                    "context_tokens": n_in,
                },
            )
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


def _int(cell: str) -> Any:
    text = cell.strip()
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text
