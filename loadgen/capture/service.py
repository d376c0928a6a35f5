"""``loadgen capture``: check the flags, serve the proxy, write the session file every second.

SIGINT or SIGTERM stop it: no new connections, replies on the wire get ``DRAIN_TIMEOUT_S`` to
finish (then they are cut and dropped), every conversation is closed and written, and a summary
line is printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from yarl import URL

from loadgen.capture.assembly import SessionAssembler
from loadgen.capture.proxy import CaptureProxy
from loadgen.capture.redact import redact
from loadgen.capture.writer import SessionRenderer, SessionSnapshot, SessionWriter
from loadgen.errors import UserError
from targets.quiet_gc import quiet_gc

LISTENING_PREFIX = "loadgen-capture listening on "
WRITE_INTERVAL_S = 1.0
DRAIN_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class CaptureOptions:
    listen: str
    upstream: str
    out: str
    session_header: str = "X-Session-ID"
    redact: bool = False
    idle_timeout_s: float = 300.0
    tenant: str = "default"
    read_timeout_s: float = 600.0  # the longest silence allowed inside an upstream reply


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[V6]:PORT`` or ``PORT`` (on 127.0.0.1)."""
    host, sep, port_text = text.rpartition(":")
    if not sep:
        host = "127.0.0.1"
    host = host.removeprefix("[").removesuffix("]") or "127.0.0.1"
    try:
        port = int(port_text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535 or any(c.isspace() for c in host):
        raise UserError(
            f"--listen {text!r} is not HOST:PORT; use e.g. 127.0.0.1:8001 (port 0 picks a free one)"
        )
    return host, port


def parse_upstream(text: str) -> URL:
    """An ``http(s)://host[:port][/base]`` URL."""
    try:
        url = URL(text)
        ok = url.scheme in ("http", "https") and bool(url.host) and not url.query_string and not url.fragment
        ok = ok and url.port is not None
    except ValueError:
        ok = False
    if not ok:
        raise UserError(f"--upstream {text!r} is not an http(s) URL; use e.g. http://127.0.0.1:8000")
    return url


def check_out(text: str) -> Path:
    """A file we can create in an existing directory, not one that already holds data."""
    path = Path(text)
    parent = path.parent
    if path.is_dir():
        raise UserError(f"--out {text}: is a directory; give a file path such as sessions.jsonl")
    if not parent.is_dir():
        raise UserError(
            f"--out {text}: directory {str(parent)!r} does not exist; create it or pick another path"
        )
    if path.exists() and path.stat().st_size > 0:
        raise UserError(f"--out {text}: already holds data; give a new file or remove it first")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UserError(f"--out {text}: not writable; pick a path you can write")
    return path


def run_capture(opts: CaptureOptions) -> int:
    """Serve until SIGINT/SIGTERM; returns the exit code (0)."""
    host, port = parse_listen(opts.listen)
    upstream = parse_upstream(opts.upstream)
    path = check_out(opts.out)
    if upstream.host in (host, "localhost") and upstream.port == port and port != 0:
        raise UserError(
            f"--upstream {opts.upstream} is the proxy's own --listen address; give the server's URL"
        )
    if not opts.idle_timeout_s > 0:
        raise UserError(
            f"--idle-timeout {opts.idle_timeout_s:g}s would end every session after one turn; use e.g. 300s"
        )
    if not opts.session_header.strip():
        raise UserError("--session-header is empty; give a header name such as X-Session-ID")
    try:
        writer = SessionWriter(path)
    except OSError as e:
        raise UserError(f"--out {opts.out}: cannot write ({e.strerror}); pick a path you can write") from None
    try:
        return asyncio.run(_serve(opts, host, port, upstream, writer))
    except UserError:
        path.unlink(missing_ok=True)  # it could not listen: leave no empty file behind
        raise
    finally:
        writer.close()


async def _serve(opts: CaptureOptions, host: str, port: int, upstream: URL, writer: SessionWriter) -> int:
    origin_s = time.monotonic()
    assembler = SessionAssembler(idle_timeout_s=opts.idle_timeout_s, keep_keys=not opts.redact)
    proxy = CaptureProxy(
        upstream, assembler, session_header=opts.session_header,
        connect_timeout_s=CONNECT_TIMEOUT_S, read_timeout_s=opts.read_timeout_s,
    )  # fmt: skip
    runner = web.AppRunner(
        proxy.app,
        handle_signals=False,
        access_log=None,
        handler_cancellation=True,
        shutdown_timeout=DRAIN_TIMEOUT_S,
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as e:
        await runner.cleanup()
        raise UserError(
            f"--listen {host}:{port}: cannot listen ({e.strerror or e}); pick a free port or another address"
        ) from None
    bound = runner.addresses[0]
    quiet_gc()  # a full collection pauses every stream's relay (15-20 ms measured)
    shown_host = f"[{host}]" if ":" in host else host
    print(
        f"{LISTENING_PREFIX}http://{shown_host}:{bound[1]} -> {upstream}, writing {writer.path} "
        f"(session key: header {opts.session_header}, else the longest shared history)",
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    renderer = SessionRenderer(
        tenant=opts.tenant, origin_s=origin_s, redactor=redact if opts.redact else None
    )
    periodic = _PeriodicWriter(assembler, renderer, writer)
    flusher = asyncio.create_task(periodic.run())
    write_error: OSError | None = None
    try:
        await stop.wait()
    finally:
        await runner.cleanup()  # stop accepting; replies on the wire get DRAIN_TIMEOUT_S
        periodic.stop()
        await flusher
        try:
            periodic.write_all()
        except OSError as e:
            write_error = e
    if write_error is not None:
        reason = write_error.strerror or write_error
        print(
            f"capture: cannot write {writer.path} ({reason}); the last turns are lost",
            file=sys.stderr,
            flush=True,
        )
        return 1
    s = assembler.stats
    print(
        f"capture: wrote {writer.sessions_closed} sessions, {s.turns} turns to {writer.path} "
        f"({s.requests} chat/completions requests; not recorded: {s.cut} cut by the client, "
        f"{s.failed} failed upstream, {s.not_recorded} unreadable)",
        flush=True,
    )
    return 0


class _PeriodicWriter:
    """Writes the session file every ``WRITE_INTERVAL_S`` when something changed, and at the end.

    Rendering, the write and the fsync run in a thread, off the loop that forwards chunks."""

    def __init__(self, assembler: SessionAssembler, renderer: SessionRenderer, writer: SessionWriter) -> None:
        self.assembler = assembler
        self.renderer = renderer
        self.writer = writer
        self._unwritten: list[SessionSnapshot] = []  # closed sessions a failed write still owes the file
        self._retry = False
        self._stopping = asyncio.Event()

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        """Until ``stop()``; a write in progress always finishes (its thread cannot be cancelled)."""
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), WRITE_INTERVAL_S)
            # Only what changed is copied here, on the loop; rendering happens in the thread.
            closed = [SessionSnapshot.of(c) for c in self.assembler.take_closed(time.monotonic())]
            changed = [SessionSnapshot.of(c) for c in self.assembler.take_changed()]
            if not (closed or changed or self._retry):
                continue
            closed = self._unwritten + closed
            try:
                await asyncio.to_thread(self._write, closed, changed)
                self._unwritten, self._retry = [], False
            except OSError as e:  # keep proxying: the traffic matters more than its copy
                self._unwritten, self._retry = closed, True
                print(f"capture: cannot write {self.writer.path} ({e.strerror or e}); will retry",
                      file=sys.stderr, flush=True)  # fmt: skip

    def write_all(self) -> None:
        """Close every conversation and write the file a last time."""
        convs = self.assembler.take_closed(time.monotonic(), everything=True)
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
