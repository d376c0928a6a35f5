"""Start a child process and wait for the stdout line that says it is serving (tests, benchmarks).

Used by ``targets.sim.process`` and ``loadgen.capture.process``: the child's stdout is a pipe read
line by line under a deadline; its stderr goes to a temporary file (a chatty child cannot block on
it), whose tail is the error message if the child exits or stays silent.
"""

from __future__ import annotations

import os
import re
import selectors
import subprocess
import tempfile
import time
from typing import IO


def start_until_line(
    argv: list[str], pattern: re.Pattern[str], timeout_s: float, *, what: str, error: type[Exception]
) -> tuple[subprocess.Popen, re.Match[str], IO[bytes]]:
    """Run ``argv`` until a stdout line matches ``pattern``: (process, match, stderr file). The
    caller owns both and closes the file when it stops the process. On exit or silence past
    ``timeout_s`` the child is killed and ``error`` raised with ``what`` and its stderr."""
    err_file = tempfile.TemporaryFile()  # noqa: SIM115 - handed to the caller, or closed below
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=err_file, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not sel.select(timeout=max(0.0, min(0.5, deadline - time.monotonic()))):
                if proc.poll() is not None:
                    break
                continue
            line = proc.stdout.readline()
            if not line:
                break
            m = pattern.match(line.strip())
            if m:
                return proc, m, err_file
    if proc.poll() is None:
        proc.kill()
    proc.wait(5)
    err_file.seek(0)
    err = err_file.read().decode(errors="replace")
    err_file.close()
    raise error(f"{what} did not start (exit {proc.returncode}): {err.strip()[-2000:]}")
