"""``loadgen capture --anonymize``: session lines with no text, only block hashes of the tokens.

A captured session becomes what ``loadgen workload anonymize`` writes (``workloads.anonymize``):
each turn's ``tokens`` and its prefix-chained ``hash_ids`` (one per ``block_size`` tokens, the
system prompt's tokens leading the first turn's), under a salt drawn at random for the file and
never written, with sizes, think times, roles, tool names and the fan-out structure kept, and
session ids ``anon-<k>``. Only the anonymised form reaches the file: no prompt text is written,
not even for a moment.

With ``--anonymize-format mooncake`` a session is written as Mooncake rows instead, one per turn
(``workloads.anonymize``, "Mooncake form": ``session_id``, the first row's ``timestamp`` in ms
since the capture's start, the follow-ups' ``delay``); sub-agents' steps are flattened into their
session's rows. Sessions are written as they close, so rows are grouped by session but the
sessions' timestamps need not rise: the whole-file reader sorts them; a file of 8 MiB or more is
streamed and must be in time order (``workloads.streamed``).

The command hands the block size and the form to the assembler process, which renders the file,
in the environment (``ANONYMIZE_BLOCK_SIZE_ENV``, ``ANONYMIZE_FORMAT_ENV``), which that process
inherits.
"""

from __future__ import annotations

import os

import orjson

from loadgen.capture.conversations import CapturedTurn
from workloads.anonymize import (
    DEFAULT_BLOCK_SIZE,
    FORMAT_MOONCAKE,
    FORMAT_SESSIONS,
    FORMATS,
    anonymize_session,
    anonymized_record,
    mooncake_rows,
    new_salt,
)
from workloads.model import Session, Turn

ANONYMIZE_BLOCK_SIZE_ENV = "LOADGEN_CAPTURE_ANONYMIZE_BLOCK_SIZE"
ANONYMIZE_FORMAT_ENV = "LOADGEN_CAPTURE_ANONYMIZE_FORMAT"

__all__ = [
    "ANONYMIZE_BLOCK_SIZE_ENV",
    "ANONYMIZE_FORMAT_ENV",
    "DEFAULT_BLOCK_SIZE",
    "Anonymizer",
    "block_size_from_env",
    "format_from_env",
]


def block_size_from_env() -> int | None:
    """The block size the command asked for, or None (no anonymising)."""
    text = os.environ.get(ANONYMIZE_BLOCK_SIZE_ENV, "").strip()
    if not text:
        return None
    try:
        size = int(text)
    except ValueError:
        size = 0
    if size < 1:
        raise ValueError(f"{ANONYMIZE_BLOCK_SIZE_ENV}={text!r} is not a block size; use an integer >= 1")
    return size


def format_from_env() -> str:
    """The anonymised form the command asked for (default: a session file)."""
    form = os.environ.get(ANONYMIZE_FORMAT_ENV, "").strip() or FORMAT_SESSIONS
    if form not in FORMATS:
        raise ValueError(f"{ANONYMIZE_FORMAT_ENV}={form!r} is not an anonymised format; use one of {', '.join(FORMATS)}")
    return form


class Anonymizer:
    """Renders a session's line (or, Mooncake form, its rows) anonymised; one salt for every line
    of one file."""

    def __init__(self, block_size: int, salt: bytes | None = None, form: str | None = None) -> None:
        self.block_size = block_size
        self._salt = salt or new_salt()
        self.form = form or format_from_env()

    def line(
        self, seq: int, tenant: str, arrival_s: float, system_prompt: str, turns: tuple[CapturedTurn, ...]
    ) -> bytes:
        session = Session(str(seq), tenant, system_prompt, tuple(_turn(t) for t in turns), index=seq)
        anon = anonymize_session(session, salt=self._salt, block_size=self.block_size, arrival_s=arrival_s)
        if self.form == FORMAT_MOONCAKE:
            return b"".join(orjson.dumps(row) + b"\n" for row in mooncake_rows(anon, salt=self._salt))
        return orjson.dumps(anonymized_record(anon)) + b"\n"


def _turn(t: CapturedTurn) -> Turn:
    return Turn(t.content, t.max_tokens, t.think_time_s, t.role, tool_call=t.tool_call, kind=t.kind or "")
