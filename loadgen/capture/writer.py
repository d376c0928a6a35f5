"""The capture's session file: closed sessions appended, open sessions rewritten at the end.

The file is always a valid session file (``workloads.load_workload`` reads it): each session
carries ``arrival_s``, its first request's time in seconds since the capture started, so a replay
can keep the captured arrivals whatever the line order. Lines of closed sessions never change once
written; after them come the open sessions as they stand (their
recorded turns so far), replaced on every write. A write is one ``pwrite`` of whole lines, padded
with spaces and a newline over any longer earlier tail (blank lines are skipped by the reader),
then the file is cut to size and synced. A capture killed at any moment therefore keeps every
session and turn up to its last write (the capture writes every second), and loses only the
turns still on the wire or recorded since.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import orjson

from loadgen.capture.anonymized import Anonymizer, block_size_from_env
from loadgen.capture.conversations import CapturedTurn, Conversation

Redactor = Callable[[str], str]


@dataclass(frozen=True, slots=True)
class SessionSnapshot:
    """A conversation as it stands, copied on the event loop and rendered off it."""

    seq: int
    session_id: str
    arrival_s: float
    system_prompt: str
    turns: tuple[CapturedTurn, ...]

    @classmethod
    def of(cls, conv: Conversation) -> SessionSnapshot:
        assert conv.session_id is not None and conv.arrival_s is not None
        return cls(conv.seq, conv.session_id, conv.arrival_s, conv.system_prompt, tuple(conv.turns))


class SessionRenderer:
    """Session file lines (docs/workloads.md "Session files"), each turn encoded once.

    Turns are only ever appended, so a session's line is its cached head and turn fragments; a
    rewrite of an open session costs only its new turns (and their redaction).
    """

    def __init__(
        self,
        *,
        tenant: str,
        origin_s: float = 0.0,
        redactor: Redactor | None = None,
        anonymize_block_size: int | None = None,
    ) -> None:
        self.tenant = tenant
        self.origin_s = origin_s  # arrival_s counts from here (the capture's start)
        self._hide = redactor or (lambda text: text)
        # --anonymize (anonymized.py): no text at all; the command passes it in the environment
        block_size = anonymize_block_size or block_size_from_env()
        self._anonymizer = Anonymizer(block_size) if block_size else None
        self._cache: dict[int, tuple[bytes, list[bytes]]] = {}
        self._lines: dict[int, bytes] = {}  # the latest line of every session not forgotten

    def line(self, s: SessionSnapshot) -> bytes:
        if self._anonymizer is not None:  # block ids chain over the whole session: no cached parts
            arrival = round(max(0.0, s.arrival_s - self.origin_s), 6)
            line = self._anonymizer.line(s.seq, self.tenant, arrival, s.system_prompt, s.turns)
            self._lines[s.seq] = line
            return line
        head, frags = self._cache.get(s.seq) or (self._head(s), [])
        for i in range(len(frags), len(s.turns)):
            frags.append(self._turn(s.turns[i], first=i == 0))
        self._cache[s.seq] = (head, frags)
        line = self._lines[s.seq] = head + b",".join(frags) + b"]}\n"
        return line

    def kept_lines(self) -> list[bytes]:
        """The latest line of every session rendered and not forgotten (the open ones)."""
        return list(self._lines.values())

    def forget(self, seq: int) -> None:
        self._cache.pop(seq, None)
        self._lines.pop(seq, None)

    def _head(self, s: SessionSnapshot) -> bytes:
        arrival = round(max(0.0, s.arrival_s - self.origin_s), 6)
        rec: dict = {"id": s.session_id, "tenant": self.tenant, "arrival_s": arrival}
        if s.system_prompt:
            rec["system_prompt"] = self._hide(s.system_prompt)
        return orjson.dumps(rec)[:-1] + b',"turns":['

    def _turn(self, t: CapturedTurn, *, first: bool) -> bytes:
        turn: dict = {"content": self._hide(t.content), "max_tokens": t.max_tokens}
        if not first:
            turn["think_time"] = round(t.think_time_s, 6)
        turn["role"] = t.role
        if t.tool_call is not None and not first:  # a first step answers no call (workloads.dag)
            turn["tool_call"] = t.tool_call
        if t.kind is not None:  # sub-agents as fan-out children and their join (subagents.py)
            turn["kind"] = t.kind
        return orjson.dumps(turn)


class SessionWriter:
    """Owns the output file; ``write`` is called from one thread at a time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._closed_end = 0  # bytes of closed sessions at the start of the file
        self._size = 0
        self.sessions_closed = 0

    def write(self, closed: Iterable[bytes], open_: Iterable[bytes]) -> None:
        """Append ``closed`` lines for good; replace the open tail with ``open_``."""
        closed_bytes = b"".join(closed)
        data = closed_bytes + b"".join(open_)
        end = self._closed_end + len(data)
        pad = self._size - end
        if pad > 0:  # cover the old, longer tail with one blank line instead of leaving half a line
            data += b" " * (pad - 1) + b"\n"
        view = memoryview(data)
        offset = self._closed_end
        while view:
            n = os.pwrite(self._fd, view, offset)
            view, offset = view[n:], offset + n
        if pad > 0:
            os.ftruncate(self._fd, end)
        os.fsync(self._fd)
        self._closed_end += len(closed_bytes)
        self.sessions_closed += closed_bytes.count(b"\n")
        self._size = end

    def close(self) -> None:
        os.close(self._fd)
