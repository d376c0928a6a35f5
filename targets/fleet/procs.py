"""Child processes the fleet owns: start, watch, stop, and never leave behind.

Every child runs in its own process group (``start_new_session=True``) so that one signal reaches
it and anything it forks, and asks the kernel to SIGKILL it when its parent dies
(``PR_SET_PDEATHSIG``), so a ``kill -9`` of the launcher still leaves no orphan on a port.
``OwnedProcess.stop`` sends SIGTERM to the group, waits up to a deadline, then SIGKILLs it.

Each child writes stdout and stderr to one log file; errors quote its last lines on one line.
Ports are checked before use: a port held by another process is refused with its holder's pid,
never silently reused.

Linux only (``prctl`` and ``/proc``), like the rest of the local fleet.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from targets.errors import TargetError

if TYPE_CHECKING:
    from targets.fleet.coldstart import ColdStartWatch

LOOPBACK = "127.0.0.1"
_PR_SET_PDEATHSIG = 1
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# Loopback must never go through a proxy a user has configured for the outside world.
_NO_PROXY = "127.0.0.1,localhost,::1"


class FleetError(TargetError):
    """A fleet that cannot start or be used as configured; ``str()`` is the one-line message.

    A ``TargetError`` (so a ``ValueError``): the CLI prints ``Error: <message>`` and exits 2.
    """


def log_tail(path: Path, lines: int = 4, max_line_chars: int = 240) -> str:
    """The last non-empty ``lines`` of a log file on one line (``a | b | c``), colours stripped."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 16384))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return "(no log)"
    kept = [_ANSI.sub("", ln).strip() for ln in text.splitlines()]
    kept = [ln[:max_line_chars] for ln in kept if ln]
    return " | ".join(kept[-lines:]) if kept else "(empty log)"


def die_with_parent(sig: int = signal.SIGTERM) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent exits (Linux).

    For processes we do not exec ourselves (a forked Locust worker) or that should stop
    gracefully (SIGTERM). Returns False where the system has no ``prctl``.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _set_parent_death_signal(parent_pid: int) -> Callable[[], None]:
    libc = ctypes.CDLL(None, use_errno=True)

    def preexec() -> None:
        # Runs in the child between fork and exec. The kernel delivers SIGKILL when the thread
        # that forked us exits, so spawn from a long-lived thread (the main thread).
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            os._exit(126)
        # The parent may already have died between fork and prctl: then nobody will signal us.
        if os.getppid() != parent_pid:
            os._exit(126)

    return preexec


@dataclass
class OwnedProcess:
    """A child we started: its name, command line, log file and ``Popen`` handle."""

    name: str
    argv: list[str]
    log_path: Path
    popen: subprocess.Popen = field(repr=False)
    launched_at: float = 0.0  # time.monotonic() just before the exec: time zero of its cold start
    cold_start: ColdStartWatch | None = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 4) -> str:
        return log_tail(self.log_path, lines)

    def describe_exit(self) -> str:
        """``'sim-0 (pid 123) exited with code 2; log tail (/x.log): ...'`` for error messages."""
        rc = self.popen.returncode
        how = f"was killed by signal {-rc}" if rc is not None and rc < 0 else f"exited with code {rc}"
        return f"{self.name} (pid {self.pid}) {how}; log tail ({self.log_path}): {self.tail()}"

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the child's process group (the child is its leader)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM the group, wait up to ``timeout_s``, then SIGKILL it and reap the child."""
        stop_all([self], timeout_s)


def stop_all(procs: Sequence[OwnedProcess], timeout_s: float = 5.0) -> None:
    """Stop several children at once under one shared deadline (SIGTERM, wait, SIGKILL).

    The group is signalled even when the leader has already exited, so that a grandchild left
    in it is not orphaned.
    """
    for p in procs:
        p.signal_group(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for p in procs:
        try:
            p.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for p in procs:
        p.signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.popen.wait(timeout=5.0)


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a child: ours, plus loopback exempt from any configured proxy."""
    env = dict(os.environ)
    for key in ("NO_PROXY", "no_proxy"):
        env[key] = ",".join(x for x in (env.get(key, ""), _NO_PROXY) if x)
    if extra:
        env.update(extra)
    return env


def spawn(
    name: str,
    argv: Sequence[str],
    *,
    log_dir: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> OwnedProcess:
    """Start ``argv`` as an owned child; stdout and stderr go to ``log_dir/<name>.log``.

    The child gets its own session and process group and dies with SIGKILL if this process
    (strictly: the calling thread) dies. A missing executable raises ``FleetError``.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    with open(log_path, "wb") as log:
        launched_at = time.monotonic()
        try:
            popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else child_env(),
                cwd=cwd,
                start_new_session=True,
                preexec_fn=_set_parent_death_signal(os.getpid()),
            )
        except FileNotFoundError as e:
            raise FleetError(f"{name}: cannot run {argv[0]!r}: {e.strerror}") from None
    return OwnedProcess(name=name, argv=list(argv), log_path=log_path, popen=popen, launched_at=launched_at)


def free_port(host: str = LOOPBACK) -> int:
    """A port that nothing listens on right now (the OS picks it; another process may still
    take it before we bind, so callers that bind later must handle 'address in use')."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _socket_inodes_on_port(port: int) -> set[str]:
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f, None)
                for line in f:
                    cols = line.split()
                    # Only sockets that own the port: listening (0A) or bound and idle (07).
                    if (
                        len(cols) > 9
                        and int(cols[1].rsplit(":", 1)[1], 16) == port
                        and cols[3] in ("0A", "07")
                        and cols[9] != "0"
                    ):
                        inodes.add(cols[9])
        except OSError:
            continue
    return inodes


def port_holder_pid(port: int) -> int | None:
    """The pid of a process holding a socket bound to ``port``, if /proc lets us see it."""
    inodes = _socket_inodes_on_port(port)
    if not inodes:
        return None
    targets = {f"socket:[{i}]" for i in inodes}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            for fd in os.scandir(f"/proc/{entry.name}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(fd.path) in targets:
                        return int(entry.name)
        except OSError:
            continue
    return None


def process_title(pid: int) -> str:
    """A short name for a pid (its command line, or ``comm``), for error messages."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
        if cmd:
            return cmd[:120]
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def port_in_use(port: int, host: str = LOOPBACK) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # SO_REUSEADDR: a port with only TIME_WAIT leftovers is free for a new listener.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return True
            raise
    return bool(_socket_inodes_on_port(port))


def ensure_port_free(port: int, what: str = "port", host: str = LOOPBACK) -> None:
    """Refuse a port another process holds: one line naming the port and, if found, its holder."""
    if not port_in_use(port, host):
        return
    pid = port_holder_pid(port)
    holder = f"pid {pid} ({process_title(pid)})" if pid else "another process (pid not visible)"
    raise FleetError(f"{what} {port} on {host} is already in use by {holder}; stop it or choose another port")


def http_get(url: str, timeout_s: float = 2.0) -> tuple[int, bytes]:
    """GET ``url`` without any proxy; returns (status, body). Connection errors raise OSError."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout_s) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def wait_for_log_line(proc: OwnedProcess, pattern: re.Pattern[str], timeout_s: float) -> re.Match[str]:
    """Wait until a line of the child's log matches ``pattern``; return the match.

    Raises ``FleetError`` with the log tail if the child exits first or the deadline passes.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            text = proc.log_path.read_text("utf-8", "replace")
        except OSError:
            text = ""
        m = pattern.search(text)
        if m:
            return m
        if not proc.alive():
            raise FleetError(f"{proc.describe_exit()}")
        if time.monotonic() > deadline:
            raise FleetError(
                f"{proc.name} (pid {proc.pid}) printed no address within {timeout_s:g}s; "
                f"log tail ({proc.log_path}): {proc.tail()}"
            )
        time.sleep(0.05)


def wait_healthy(
    proc: OwnedProcess,
    url: str,
    timeout_s: float,
    ready: Callable[[int, bytes], bool] = lambda status, _body: status == 200,
) -> bytes:
    """Poll ``url`` until ``ready(status, body)``; return the last body.

    Every poll has its own timeout and the whole wait a deadline. A child that exits, or that
    is still not ready at the deadline, raises ``FleetError`` naming it, the URL and its log
    tail.
    """
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while True:
        if not proc.alive():
            raise FleetError(proc.describe_exit())
        try:
            status, body = http_get(url, timeout_s=min(2.0, max(0.1, deadline - time.monotonic())))
            if ready(status, body):
                return body
            last = f"HTTP {status} {body[:80].decode('utf-8', 'replace').strip()}"
        except OSError as e:
            last = str(getattr(e, "reason", None) or e)
        if time.monotonic() > deadline:
            raise FleetError(
                f"{proc.name} (pid {proc.pid}) not healthy at {url} within {timeout_s:g}s "
                f"(last: {last}); log tail ({proc.log_path}): {proc.tail()}"
            )
        time.sleep(0.1)
