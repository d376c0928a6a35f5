"""``DatasetWorkload``: sessions read from a dataset or trace file by one of ``workloads.readers``.

A reader turns its format into normalised session records; this class turns a record into a
``Session`` for (seed, index). A turn's text is one of:

* ``content``: text from the file, sent as it is whatever the seed;
* ``tokens``: a count, turned into synthetic text from the session's ``text`` stream;
* ``blocks``: ``[[block_id, n_tokens], ...]``, prefix blocks shared across requests (Mooncake's
  ``hash_ids``): block b's text depends only on (seed, b), and a block cut short is a prefix of the
  whole block, so requests that share leading blocks share the same prompt prefix.

Sessions are in arrival order: when the file carries timestamps, session k is the k-th arrival and
:meth:`DatasetWorkload.arrival_offsets` gives its offset in seconds from the first.
"""

from __future__ import annotations

import hashlib
import json
import random
from typing import Any

import numpy as np

from workloads.blocks import BlockTexts
from workloads.model import Session, Turn
from workloads.text import BUILTIN, TextTokenizer
from workloads.workload import Workload, check_seed_index, session_rng


class RecordSessions:
    """Sessions built from normalised records (the readers' output); for the workloads that hold
    them (``DatasetWorkload``) and those that stream them (``workloads.streamed``).

    Needs ``name``, ``tokenizer``, ``block_size`` and ``_blocks`` (a ``BlockTexts``).
    """

    name: str
    tokenizer: TextTokenizer
    block_size: int | None
    _blocks: BlockTexts

    def record_session(self, seed: int, index: int, rec: dict[str, Any]) -> Session:
        """Session ``index`` for ``seed`` built from its normalised record ``rec``."""
        r_text = session_rng(seed, index, "text")
        turns = tuple(
            Turn(
                content=self._text(seed, t, r_text),
                max_tokens=t["max_tokens"],
                think_time_s=t.get("think_time", 0.0),
                role=t.get("role", "user"),
            )
            for t in rec["turns"]
        )
        return Session(
            session_id=rec["id"],
            tenant=rec["tenant"],
            system_prompt=rec.get("system_prompt", ""),
            turns=turns,
            index=index,
            meta={"workload": self.name},
        )

    def _text(self, seed: int, turn: dict[str, Any], rng: random.Random) -> str:
        if "content" in turn:
            return turn["content"]
        if "tokens" in turn:
            return self.tokenizer.text(turn["tokens"], rng)
        return self._blocks.text(seed, turn["blocks"], self.block_size or 1, self.tokenizer)


class DatasetWorkload(RecordSessions, Workload):
    """The sessions of a dataset or trace file, in file (or arrival) order."""

    def __init__(
        self,
        records: list[dict[str, Any]],
        *,
        kind: str,
        name: str,
        source: str,
        options: dict[str, Any] | None = None,
        offsets_s: np.ndarray | None = None,
        block_size: int | None = None,
        stats: dict[str, Any] | None = None,
        tokenizer: TextTokenizer = BUILTIN,
    ) -> None:
        if offsets_s is not None and len(offsets_s) != len(records):
            raise ValueError("offsets_s must give one offset per record")
        self._records = records
        self.kind = kind
        self.name = name
        self.source = source
        self.options = dict(options or {})
        self._offsets = offsets_s
        self.block_size = block_size
        self.stats = dict(stats or {})
        self.tokenizer = tokenizer
        self._tenants = tuple(dict.fromkeys(r["tenant"] for r in records))
        self._blocks = BlockTexts()

    @property
    def num_sessions(self) -> int:
        return len(self._records)

    @property
    def tenants(self) -> tuple[str, ...]:
        return self._tenants

    def arrival_offsets(self) -> np.ndarray | None:
        return None if self._offsets is None else self._offsets.copy()

    def record(self, index: int) -> dict[str, Any]:
        """The normalised record of session ``index`` (read-only by convention)."""
        return self._records[index]

    def session(self, seed: int, index: int) -> Session:
        check_seed_index(seed, index, len(self._records), where=self.source)
        return self.record_session(seed, index, self._records[index])

    def turn_hash_ids(self, index: int) -> list[dict[str, Any] | None] | None:
        """Per turn of session ``index``: ``{"hash_ids", "block_size", "tokens"}`` for a turn built from blocks."""
        turns = self._records[index]["turns"]
        if not any("blocks" in t for t in turns):
            return None
        return [
            {
                "hash_ids": [b for b, _ in t["blocks"]],
                "block_size": self.block_size or 1,
                "tokens": sum(n for _, n in t["blocks"]),
            }
            if "blocks" in t
            else None
            for t in turns
        ]

    def fingerprint(self) -> str:
        """sha256 over the reader, its options, the tokenizer and the parsed records (not the bytes)."""
        h = hashlib.sha256(f"dataset:{self.kind}:1\n".encode())
        h.update(json.dumps(self.options, sort_keys=True, default=str).encode())
        h.update(json.dumps(self.tokenizer.describe(), sort_keys=True).encode())
        for rec in self._records:
            h.update(json.dumps(rec, sort_keys=True, separators=(",", ":")).encode())
            h.update(b"\n")
        if self._offsets is not None:
            h.update(np.ascontiguousarray(self._offsets, dtype=np.float64).tobytes())
        return h.hexdigest()

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "source": self.source,
            "fingerprint": self.fingerprint(),
            "num_sessions": self.num_sessions,
            "options": self.options,
            "timestamps": self._offsets is not None,
        }
