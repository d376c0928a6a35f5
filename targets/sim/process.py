"""Start a sim as a child process and learn its port from the listening line (tests, benchmarks).

``SimProcess.start([...flags])`` runs ``python -m targets.sim --port 0 ...``, waits (with a
deadline) for ``loadgen-sim listening on http://HOST:PORT (...)`` on its stdout, and returns the
handle. ``stop()`` sends SIGTERM, waits, and kills if needed; use it in a ``finally`` or a fixture
finalizer so no sim outlives its caller.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys

from targets.child_start import start_until_line

LISTENING_RE = re.compile(r"^loadgen-sim listening on (http://(\S+):(\d+)) \(profile (\S+), time-scale (\S+)\)$")


class SimStartError(RuntimeError):
    """The sim exited or stayed silent past the deadline; the message carries its stderr."""


class SimProcess:
    """A running ``python -m targets.sim`` child."""

    def __init__(self, proc: subprocess.Popen, url: str, port: int, stderr_file) -> None:
        self.proc = proc
        self.url = url
        self.port = port
        self._stderr = stderr_file
        self._stderr_text: str | None = None  # kept once stopped

    def stderr(self) -> str:
        """What the sim wrote to stderr so far (all of it once stopped)."""
        if self._stderr_text is not None:
            return self._stderr_text
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")

    @property
    def pid(self) -> int:
        return self.proc.pid

    @classmethod
    def start(cls, args: list[str], timeout_s: float = 20.0, python: str | None = None) -> SimProcess:
        """Start a sim with ``args`` (``--port 0`` is added unless a port is given)."""
        if "--port" not in args:
            args = ["--port", "0", *args]
        proc, m, err_file = start_until_line(
            [python or sys.executable, "-m", "targets.sim", *args],
            LISTENING_RE,
            timeout_s,
            what="the sim",
            error=SimStartError,
        )
        return cls(proc, m.group(1), int(m.group(3)), err_file)

    def stop(self, timeout_s: float = 5.0) -> int:
        """SIGTERM, wait up to ``timeout_s``, then SIGKILL. Returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._kill(self.proc)
        if self.proc.stdout:
            self.proc.stdout.close()
        if self._stderr_text is None:
            self._stderr_text = self.stderr()
            self._stderr.close()
        return self.proc.returncode

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
