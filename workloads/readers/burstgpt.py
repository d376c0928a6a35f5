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
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from workloads.dataset import DatasetWorkload
from workloads.errors import WorkloadError
from workloads.readers.azure import _int
from workloads.readers.base import WorkloadReader, short, whole_number
from workloads.readers.stream import TraceRow, iter_text_lines
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
        where = str(path)
        self.check_options(options, where)
        tenant = options.get("tenant", DEFAULT_TENANT) or DEFAULT_TENANT
        keep_model = _choices(options.get("model"))
        keep_log = _choices(options.get("log_type"))
        reader = csv.reader(iter_text_lines(path, "BurstGPT trace"))
        header = [h.strip().lower() for h in next(reader, None) or []]
        missing = [c for c in COLUMNS if c not in header]
        if missing:
            found = ", ".join(header)[:60] or "nothing"
            raise WorkloadError(
                f"{where} line 1: no {COLUMNS[missing[0]]} column (found {found}); give a CSV with "
                "Timestamp, Model, Request tokens, Response tokens, Total tokens and Log Type"
            )
        col = {c: header.index(c) for c in COLUMNS}
        if dropped is None:
            dropped = {}
        for key in ("model", "log_type", "zero_response_tokens"):
            dropped.setdefault(key, 0)
        stem = path.stem
        kept = 0
        for lineno, row in enumerate(reader, start=2):
            if not row or not any(cell.strip() for cell in row):
                continue
            at = f"{where} line {lineno}"
            if len(row) < len(header):
                raise WorkloadError(f"{at}: {len(row)} columns, the header has {len(header)}; give every column")
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
            kept += 1
            yield TraceRow(
                lineno,
                t,
                {
                    "id": f"{stem}-L{lineno}",
                    "tenant": tenant,
                    "turns": [{"tokens": max(1, n_in), "max_tokens": n_out, "role": "user"}],
                    "request_tokens": n_in,
                },
            )
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
