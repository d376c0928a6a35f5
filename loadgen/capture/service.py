"""``loadgen capture``: check the flags, serve the relay, start the assembler process beside it.

Two processes: this one relays (aiohttp on uvloop, ``proxy.py``) and only moves bytes; the
assembler process (``assembler_process.py``), fed the exchanges through a pipe, parses them,
keeps the sessions and writes the session file every second. SIGINT or SIGTERM stop it: no new
connections, replies on the wire get ``DRAIN_TIMEOUT_S`` to finish (then they are cut and
dropped), the pipe is closed, and the assembler closes every conversation, writes them and prints
the summary line.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import uvloop
from aiohttp import web
from yarl import URL

from loadgen.capture.assembler_process import AssemblerConfig
from loadgen.capture.feed import ExchangeFeed
from loadgen.capture.proxy import CaptureProxy
from loadgen.capture.writer import SessionWriter
from loadgen.errors import UserError
from targets.quiet_gc import quiet_gc

LISTENING_PREFIX = "loadgen-capture listening on "
DRAIN_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 10.0
ASSEMBLER_EXIT_TIMEOUT_S = 120.0  # its last write of a long capture


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
        SessionWriter(path).close()  # created here, so a bad path is the user's error, not the child's
    except OSError as e:
        raise UserError(f"--out {opts.out}: cannot write ({e.strerror}); pick a path you can write") from None
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(_serve(opts, host, port, upstream, path))
    except UserError:
        path.unlink(missing_ok=True)  # it could not listen: leave no empty file behind
        raise


async def _serve(opts: CaptureOptions, host: str, port: int, upstream: URL, path: Path) -> int:
    origin_s = time.monotonic()
    feed = ExchangeFeed()
    proxy = CaptureProxy(
        upstream, feed, session_header=opts.session_header,
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
    config = AssemblerConfig(
        out=str(path), idle_timeout_s=opts.idle_timeout_s, tenant=opts.tenant, redact=opts.redact,
        origin_s=origin_s,
    )  # fmt: skip
    assembler = _start_assembler(config)
    await feed.connect(assembler.stdin_fd)
    quiet_gc()  # a full collection pauses every stream's relay (15-20 ms measured)
    shown_host = f"[{host}]" if ":" in host else host
    print(
        f"{LISTENING_PREFIX}http://{shown_host}:{bound[1]} -> {upstream}, writing {path} "
        f"(session key: header {opts.session_header}, else the longest shared history; "
        f"relay: {proxy.relay})",
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()  # stop accepting; replies on the wire get DRAIN_TIMEOUT_S
        feed.close()  # the assembler's cue to write everything and exit
        rc = await asyncio.to_thread(assembler.wait_exit, ASSEMBLER_EXIT_TIMEOUT_S)
    return 1 if feed.broken else rc


class _Assembler:
    """The assembler process, reading the pipe whose write end ``stdin_fd`` is."""

    def __init__(self, proc: subprocess.Popen, stdin_fd: int) -> None:
        self.proc = proc
        self.stdin_fd = stdin_fd

    def wait_exit(self, timeout_s: float) -> int:
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            print(f"capture: the session assembler did not finish within {timeout_s:g}s; the file may "
                  "lack the last turns", file=sys.stderr, flush=True)  # fmt: skip
            return 1


def _start_assembler(config: AssemblerConfig) -> _Assembler:
    read_fd, write_fd = os.pipe()
    os.set_inheritable(write_fd, False)
    try:
        proc = subprocess.Popen(
            # -c, not -m: the package imports the module first, and -m would run it a second time
            [
                sys.executable,
                "-c",
                "from loadgen.capture.assembler_process import main; main()",
                config.to_arg(),
            ],
            stdin=read_fd,
            process_group=0,  # a Ctrl-C reaches the relay only; the pipe's end is the assembler's cue
        )
    finally:
        os.close(read_fd)
    return _Assembler(proc, write_fd)
