"""loadgen's own session files (``workloads/sessions_jsonl.py``) as a reader, so detection finds them.

A session is one line, so a large session file streams (``workloads.streamed``): its lines are
read in order, and with ``arrival_s`` on its lines they must be in arrival order (a capture
writes them so when its sessions end in order; ``sort`` them otherwise).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from workloads.blocks import BlockTexts
from workloads.model import Session
from workloads.readers.base import WorkloadReader
from workloads.readers.stream import TraceRow
from workloads.sessions_jsonl import (
    SessionFileWorkload,
    build_session,
    iter_session_rows,
    load_sessions_jsonl,
)
from workloads.text import BUILTIN, TextTokenizer


class SessionsReader(WorkloadReader):
    name = "sessions"
    description = "loadgen session file (JSON lines: id, tenant, system_prompt, turns)"
    suffixes = (".jsonl",)
    options: dict[str, str] = {}

    @classmethod
    def sniff(cls, path: Path, first: Any) -> bool:
        return isinstance(first, dict) and "turns" in first

    def read(self, path: Path, options: Mapping[str, str], *, tokenizer: TextTokenizer = BUILTIN) -> SessionFileWorkload:
        self.check_options(options, str(path))
        workload = load_sessions_jsonl(path)
        workload.tokenizer = tokenizer
        return workload

    def iter_rows(
        self, path: Path, options: Mapping[str, str], *, tokenizer: TextTokenizer = BUILTIN
    ) -> Iterator[TraceRow]:
        """The file's sessions line by line (``sessions_jsonl.iter_session_rows``)."""
        self.check_options(options, str(path))
        return iter_session_rows(path)

    @staticmethod
    def session_from_record(
        rec: dict[str, Any], seed: int, index: int, *, name: str, tokenizer: TextTokenizer, blocks: BlockTexts
    ) -> Session:
        """A streamed row's session: a session file's record (system prompt, cold turns, DAG
        steps, per-turn blocks) is not a dataset record, so it is built as the whole file builds it."""
        return build_session(rec, seed, index, name=name, tokenizer=tokenizer, blocks=blocks)
