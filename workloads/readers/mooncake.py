"""Mooncake traces: one request per line, with arrival time, sizes and prefix-block hashes.

Line format (Mooncake's published traces)::

    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48, ...]}

* ``timestamp``: arrival in milliseconds (any origin; replay starts at the earliest);
* ``input_length``: prompt tokens; ``output_length``: tokens generated (0 is replayed as 1);
* ``hash_ids``: one id per block of ``block_size`` prompt tokens (option, default 512), the last
  block possibly partial. Requests that share leading ids share the same prompt prefix: block b's
  text depends only on (seed, b), so prefix caches and cache-aware routers see the trace's reuse.

Each line is a one-turn session (the trace has no conversation structure; its reuse lives in the
shared blocks). Sessions are in arrival order; ties keep file order.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from workloads.dataset import DatasetWorkload
from workloads.errors import WorkloadError
from workloads.readers.base import WorkloadReader, iter_json_lines, open_text, option_int, short, whole_number
from workloads.spec import DEFAULT_TENANT
from workloads.text import BUILTIN, TextTokenizer

DEFAULT_BLOCK_SIZE = 512
FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")


class MooncakeReader(WorkloadReader):
    name = "mooncake"
    description = "Mooncake trace (timestamp ms, input_length, output_length, hash_ids), one request each"
    suffixes = (".jsonl",)
    options = {
        "block_size": f"prompt tokens per hash id (default {DEFAULT_BLOCK_SIZE})",
        "tenant": "tenant name of every session (default 'default')",
    }

    @classmethod
    def sniff(cls, path: Path, first: Any) -> bool:
        return isinstance(first, dict) and "hash_ids" in first and "input_length" in first

    def read(self, path: Path, options: Mapping[str, str], *, tokenizer: TextTokenizer = BUILTIN) -> DatasetWorkload:
        where = str(path)
        self.check_options(options, where)
        block_size = option_int(options, "block_size", DEFAULT_BLOCK_SIZE, where=where, at_least=1)
        assert block_size is not None
        tenant = options.get("tenant", DEFAULT_TENANT) or DEFAULT_TENANT
        text = open_text(path, "Mooncake trace")
        rows: list[tuple[float, dict[str, Any], int]] = []
        for lineno, obj in iter_json_lines(path, text):
            t_s, rec = _row(obj, f"{where} line {lineno}", block_size)
            rows.append((t_s, rec, lineno))
        if not rows:
            raise WorkloadError(f"{where}: holds no requests; give one JSON object per line")
        rows.sort(key=lambda r: r[0])  # stable: ties keep file order
        t0 = rows[0][0]
        records = []
        seen: set[int] = set()
        reused_tokens = total_tokens = 0
        for _, rec, lineno in rows:
            rec["id"] = f"{path.stem}-L{lineno}"
            rec["tenant"] = tenant
            records.append(rec)
            # Prefix reuse as a prefix cache sees it: leading blocks already sent by an earlier request.
            blocks = rec["turns"][0]["blocks"]
            n_in = sum(n for _, n in blocks)
            total_tokens += n_in
            for block_id, n in blocks:
                if block_id not in seen:
                    break
                reused_tokens += n
            seen.update(b for b, _ in blocks)
        offsets = np.array([r[0] - t0 for r in rows], dtype=np.float64)
        stats = {
            "block_size": block_size,
            "unique_blocks": len(seen),
            "prefix_reuse": reused_tokens / total_tokens if total_tokens else 0.0,
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


def _row(obj: Any, at: str, block_size: int) -> tuple[float, dict[str, Any]]:
    if not isinstance(obj, dict):
        raise WorkloadError(f"{at}: {short(obj)} is not a JSON object; give {{{', '.join(FIELDS)}}}")
    for key in FIELDS:
        if key not in obj:
            raise WorkloadError(f"{at}: {key}: missing; every request needs {', '.join(FIELDS)}")
    ts = obj["timestamp"]
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts):
        raise WorkloadError(f"{at}: timestamp: {short(ts)} is not allowed; give a number of milliseconds")
    n_in = whole_number(obj["input_length"], where=f"{at}: input_length", at_least=1)
    n_out = whole_number(obj["output_length"], where=f"{at}: output_length", at_least=0)
    hash_ids = obj["hash_ids"]
    if not isinstance(hash_ids, list) or not hash_ids:
        raise WorkloadError(f"{at}: hash_ids: {short(hash_ids)} is not allowed; give a non-empty list of integers")
    ids = [whole_number(h, where=f"{at}: hash_ids", at_least=0) for h in hash_ids]
    want = -(-n_in // block_size)
    if len(ids) != want:
        raise WorkloadError(
            f"{at}: hash_ids: {len(ids)} blocks but input_length {n_in} needs {want} of {block_size} tokens; "
            "check the block_size workload option"
        )
    blocks = [[b, block_size] for b in ids]
    blocks[-1][1] = n_in - block_size * (len(ids) - 1)
    turn = {"blocks": blocks, "max_tokens": max(1, n_out), "role": "user"}
    return float(ts) / 1000.0, {"turns": [turn]}
