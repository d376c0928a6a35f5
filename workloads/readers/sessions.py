"""loadgen's own session files (``workloads/sessions_jsonl.py``) as a reader, so detection finds them."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from workloads.readers.base import WorkloadReader
from workloads.sessions_jsonl import SessionFileWorkload, load_sessions_jsonl
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
