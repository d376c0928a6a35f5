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
import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from workloads.arrivals import csv_time_values
from workloads.dataset import DatasetWorkload
from workloads.errors import WorkloadError
from workloads.readers.base import WorkloadReader, open_text, whole_number
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

    def read(self, path: Path, options: Mapping[str, str], *, tokenizer: TextTokenizer = BUILTIN) -> DatasetWorkload:
        where = str(path)
        self.check_options(options, where)
        tenant = options.get("tenant", DEFAULT_TENANT) or DEFAULT_TENANT
        reader = csv.reader(io.StringIO(open_text(path, "Azure trace")))
        header = [h.strip().lower() for h in next(reader, None) or []]
        missing = [c for c in COLUMNS if c not in header]
        if missing:
            found = ", ".join(header)[:60] or "nothing"
            raise WorkloadError(
                f"{where} line 1: no {missing[0]} column (found {found}); "
                "give a CSV with TIMESTAMP, ContextTokens and GeneratedTokens"
            )
        col = {c: header.index(c) for c in COLUMNS}
        rows: list[tuple[int, str, int, int]] = []
        for lineno, row in enumerate(reader, start=2):
            if not row or not any(cell.strip() for cell in row):
                continue
            at = f"{where} line {lineno}"
            if len(row) < len(header):
                raise WorkloadError(f"{at}: {len(row)} columns, the header has {len(header)}; give every column")
            n_in = whole_number(_int(row[col["contexttokens"]]), where=f"{at}: ContextTokens", at_least=0)
            n_out = whole_number(_int(row[col["generatedtokens"]]), where=f"{at}: GeneratedTokens", at_least=0)
            rows.append((lineno, row[col["timestamp"]].strip(), n_in, n_out))
        if not rows:
            raise WorkloadError(f"{where}: holds no requests; give one CSV row per request under the header")
        times = csv_time_values(path, ((lineno, cell) for lineno, cell, _, _ in rows))
        order = sorted(range(len(rows)), key=lambda i: times[i])
        t0 = times[order[0]]
        records = []
        for i in order:
            lineno, _, n_in, n_out = rows[i]
            records.append(
                {
                    "id": f"{path.stem}-L{lineno}",
                    "tenant": tenant,
                    "turns": [{"tokens": max(1, n_in), "max_tokens": max(1, n_out), "role": "user"}],
                }
            )
        offsets = np.array([times[i] - t0 for i in order], dtype=np.float64)
        return DatasetWorkload(
            records,
            kind=self.name,
            name=path.stem,
            source=where,
            options=dict(options),
            offsets_s=offsets,
            stats={"zero_context_rows": sum(1 for r in rows if r[2] == 0)},
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
