"""Start ``loadgen capture`` as a child process and learn its port (tests, benchmarks).

``CaptureProcess.start([...flags])`` runs ``python -m loadgen capture --listen 127.0.0.1:0 ...``,
waits (with a deadline) for its ``loadgen-capture listening on http://HOST:PORT ...`` line and
returns the handle; ``stop()`` sends SIGTERM, waits for the final write, and kills on overrun.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys

from loadgen.capture.service import LISTENING_PREFIX
from targets.child_start import start_until_line

_LISTENING_RE = re.compile(re.escape(LISTENING_PREFIX) + r"(http://\S+?:(\d+)) ")


class CaptureStartError(RuntimeError):
    """The capture exited or stayed silent past the deadline; the message carries its stderr."""


class CaptureProcess:
    def __init__(self, proc: subprocess.Popen, url: str, port: int, stderr_file) -> None:
        self.proc = proc
        self.url = url
        self.port = port
        self._stderr = stderr_file
        self.output = ""  # what it printed after the listening line, once stopped
        self.listening = ""  # the listening line itself

    @classmethod
    def start(cls, args: list[str], timeout_s: float = 20.0) -> CaptureProcess:
        if "--listen" not in args:
            args = ["--listen", "127.0.0.1:0", *args]
        proc, m, err_file = start_until_line(
            [sys.executable, "-m", "loadgen", "capture", *args],
            _LISTENING_RE,
            timeout_s,
            what="the capture",
            error=CaptureStartError,
        )
        cap = cls(proc, m.group(1), int(m.group(2)), err_file)
        cap.listening = m.string
        return cap

    def stderr(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")

    def stop(self, timeout_s: float = 20.0) -> int:
        """SIGTERM, wait up to ``timeout_s`` (it drains and writes), then SIGKILL. Returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc.stdout and not self.proc.stdout.closed:
            self.output = self.proc.stdout.read()
            self.proc.stdout.close()
        return self.proc.returncode
