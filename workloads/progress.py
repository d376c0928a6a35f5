"""A progress line for long passes over a workload (``inspect``, ``analyze``, ``anonymize``)."""

from __future__ import annotations

import time
from typing import TextIO


class ReadProgress:
    """``progress(k)`` callback: at most once a second, ``<what>: 1,234,567 sessions read, 12 s``.

    On a terminal the line is rewritten in place and cleared by :meth:`done`; elsewhere (a log)
    each report is a line of its own.
    """

    def __init__(self, stream: TextIO, what: str, *, every_s: float = 1.0) -> None:
        self._stream = stream
        self._what = what
        self._every_s = every_s
        self._tty = stream.isatty()
        self._t0 = time.monotonic()
        self._last = self._t0
        self._shown = False

    def __call__(self, sessions: int) -> None:
        now = time.monotonic()
        if now - self._last < self._every_s:
            return
        self._last = now
        line = f"{self._what}: {sessions:,} sessions read, {now - self._t0:.0f} s"
        self._stream.write(f"\r{line}\x1b[K" if self._tty else line + "\n")
        self._stream.flush()
        self._shown = True

    def done(self) -> None:
        """Clears the terminal line (a log keeps its lines)."""
        if self._tty and self._shown:
            self._stream.write("\r\x1b[K")
            self._stream.flush()
