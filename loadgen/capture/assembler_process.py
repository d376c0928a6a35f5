"""The capture's assembler process: reads the relay's exchange events, writes the session file.

Started by ``service.py`` with the relay's pipe as its stdin and its settings as one JSON
argument (``AssemblerConfig``). It parses every recorded exchange
(``recorder.py``), keeps the sessions (``assembly.py``), and writes the file every
``WRITE_INTERVAL_S`` when something changed: closed sessions appended for good, open ones
rewritten at the end (``writer.py``). The pipe's end is its cue to finish: the relay closed it
after its last reply, or died (then what was still on the wire was cut). Either way it closes
every session, writes the file a last time and prints the summary line.

It runs at a lower CPU priority (``NICE``) than the relay, so on a shared core a burst of chunks
to relay preempts it; SIGINT and SIGTERM are the relay's to act on (a Ctrl-C reaches both).
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from loadgen.capture.assembly import SessionAssembler
from loadgen.capture.feed import decode_frames
from loadgen.capture.recorder import ExchangeRecorder
from loadgen.capture.redact import redact
from loadgen.capture.writer import SessionRenderer, SessionSnapshot, SessionWriter

WRITE_INTERVAL_S = 1.0
NICE = 5
_READ_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class AssemblerConfig:
    out: str
    idle_timeout_s: float
    tenant: str
    redact: bool
    origin_s: float  # arrival_s counts from here (monotonic s: the capture's start)

    def to_arg(self) -> str:
        return json.dumps(
            {"out": self.out, "idle_timeout_s": self.idle_timeout_s, "tenant": self.tenant,
             "redact": self.redact, "origin_s": self.origin_s}
        )  # fmt: skip

    @classmethod
    def from_arg(cls, text: str) -> AssemblerConfig:
        return cls(**json.loads(text))


class PeriodicWriter:
    """Writes what changed since the last write; a failed write is retried at the next one."""

    def __init__(self, assembler: SessionAssembler, renderer: SessionRenderer, writer: SessionWriter) -> None:
        self.assembler = assembler
        self.renderer = renderer
        self.writer = writer
        self._unwritten: list[SessionSnapshot] = []  # closed sessions a failed write still owes the file
        self._retry = False

    def write_changes(self, now_s: float) -> None:
        closed = [SessionSnapshot.of(c) for c in self.assembler.take_closed(now_s)]
        changed = [SessionSnapshot.of(c) for c in self.assembler.take_changed()]
        if not (closed or changed or self._retry):
            return
        closed = self._unwritten + closed
        try:
            self._write(closed, changed)
            self._unwritten, self._retry = [], False
        except OSError as e:  # keep going: the traffic matters more than its copy
            self._unwritten, self._retry = closed, True
            print(f"capture: cannot write {self.writer.path} ({e.strerror or e}); will retry",
                  file=sys.stderr, flush=True)  # fmt: skip

    def write_all(self, now_s: float) -> None:
        """Close every conversation and write the file a last time (raises OSError)."""
        convs = self.assembler.take_closed(now_s, everything=True)
        self._write(self._unwritten + [SessionSnapshot.of(c) for c in convs], [])

    def _write(self, closed: list[SessionSnapshot], changed: list[SessionSnapshot]) -> None:
        """Closed sessions are appended for good; the open ones (``changed`` re-rendered, the rest
        as last rendered) are the new tail."""
        r = self.renderer
        for s in changed:
            r.line(s)
        closed_lines = [r.line(s) for s in closed]
        for s in closed:
            r.forget(s.seq)
        self.writer.write(closed_lines, r.kept_lines())


def run(config: AssemblerConfig, fd: int) -> int:
    """Until ``fd`` ends; returns the exit code (1 when the last write failed)."""
    assembler = SessionAssembler(idle_timeout_s=config.idle_timeout_s, keep_keys=not config.redact)
    recorder = ExchangeRecorder(assembler)
    writer = SessionWriter(Path(config.out))
    renderer = SessionRenderer(
        tenant=config.tenant, origin_s=config.origin_s, redactor=redact if config.redact else None
    )
    periodic = PeriodicWriter(assembler, renderer, writer)
    buf = bytearray()
    next_write_s = time.monotonic() + WRITE_INTERVAL_S
    try:
        while True:
            ready, _, _ = select.select([fd], [], [], max(0.0, next_write_s - time.monotonic()))
            if ready:
                data = os.read(fd, _READ_BYTES)
                if not data:
                    break
                buf += data
                for events in decode_frames(buf):
                    recorder.apply(events)
            if time.monotonic() >= next_write_s:
                periodic.write_changes(time.monotonic())
                next_write_s = time.monotonic() + WRITE_INTERVAL_S
        cut = recorder.open_exchanges
        if cut:
            print(f"capture: the relay ended with {cut} replies on the wire; they were cut, not recorded",
                  file=sys.stderr, flush=True)  # fmt: skip
        recorder.abandon_open(time.monotonic_ns())
        try:
            periodic.write_all(time.monotonic())
        except OSError as e:
            print(f"capture: cannot write {writer.path} ({e.strerror or e}); the last turns are lost",
                  file=sys.stderr, flush=True)  # fmt: skip
            return 1
    finally:
        writer.close()
    s = assembler.stats
    shed = f", {recorder.shed} shed (the recording fell behind)" if recorder.shed else ""
    print(
        f"capture: wrote {writer.sessions_closed} sessions, {s.turns} turns to {writer.path} "
        f"({s.requests} requests; not recorded: {s.cut} cut by the client, "
        f"{s.failed} failed upstream, {s.not_recorded} unreadable{shed})",
        flush=True,
    )
    return 0


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        os.nice(NICE)
    except OSError:
        pass
    sys.exit(run(AssemblerConfig.from_arg(sys.argv[1]), sys.stdin.fileno()))


if __name__ == "__main__":
    main()
