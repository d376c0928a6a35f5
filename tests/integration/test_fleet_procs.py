"""Owned child processes: stop, escalation, parent death, ports and health deadlines."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from targets.fleet.procs import (
    FleetError,
    ensure_port_free,
    free_port,
    port_holder_pid,
    spawn,
    wait_for_log_line,
    wait_healthy,
)


def gone(pid: int, within_s: float = 5.0) -> bool:
    """True once ``pid`` no longer exists (or is a zombie nobody will reap)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def python(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def test_stop_ends_the_child_and_keeps_its_log(tmp_path):
    proc = spawn("sleeper", python("print('hello from the child', flush=True); import time; time.sleep(60)"),
                 log_dir=tmp_path)  # fmt: skip
    wait_for_log_line(proc, re.compile("hello from the child"), 10)
    proc.stop(timeout_s=5)
    assert not proc.alive() and gone(proc.pid)
    assert proc.popen.returncode == -signal.SIGTERM
    assert "hello from the child" in (tmp_path / "sleeper.log").read_text()


def test_stop_escalates_to_sigkill_after_the_deadline(tmp_path):
    code = """
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ignoring SIGTERM", flush=True)
        time.sleep(60)
    """
    proc = spawn("stubborn", python(code), log_dir=tmp_path)
    wait_for_log_line(proc, re.compile("ignoring SIGTERM"), 10)
    t0 = time.monotonic()
    proc.stop(timeout_s=0.5)
    assert time.monotonic() - t0 < 3
    assert proc.popen.returncode == -signal.SIGKILL


def test_stop_reaches_grandchildren_in_the_group(tmp_path):
    proc = spawn("shell", ["bash", "-c", "sleep 60 & echo grandchild $!; wait"], log_dir=tmp_path)
    grandchild = int(wait_for_log_line(proc, re.compile(r"grandchild (\d+)"), 10).group(1))
    proc.stop(timeout_s=5)
    assert gone(grandchild)


def test_children_die_when_their_parent_is_killed(tmp_path):
    # An intermediate parent spawns an owned child, then is SIGKILLed: the kernel kills the child.
    code = f"""
        import time
        from pathlib import Path
        from targets.fleet.procs import spawn
        child = spawn("orphan-candidate", ["sleep", "60"], log_dir=Path({str(tmp_path)!r}))
        print("child", child.pid, flush=True)
        time.sleep(60)
    """
    parent = subprocess.Popen(python(code), stdout=subprocess.PIPE, text=True)
    try:
        line = parent.stdout.readline()
        child = int(line.split()[1])
        assert not gone(child, within_s=0.2)
        parent.kill()
        parent.wait(timeout=5)
        assert gone(child, within_s=5)
    finally:
        parent.kill()
        parent.wait()


def test_free_port_is_loopback_and_bindable(monkeypatch):
    bound: list[tuple] = []

    class Recording(socket.socket):
        def bind(self, address):
            bound.append(address)
            super().bind(address)

    monkeypatch.setattr(socket, "socket", Recording)
    port = free_port()
    monkeypatch.undo()
    assert bound == [("127.0.0.1", 0)]  # the OS picked it on loopback, not on every interface
    assert isinstance(port, int) and 1024 <= port <= 65535
    assert port_holder_pid(port) is None  # nothing holds it once free_port returns
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        assert s.getsockname() == ("127.0.0.1", port)
        assert port_holder_pid(port) == os.getpid()


def test_a_held_port_is_refused_naming_the_holder():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert port_holder_pid(port) == os.getpid()
        with pytest.raises(FleetError) as e:
            ensure_port_free(port, "router port")
    message = str(e.value)
    assert message.startswith(f"router port {port} on 127.0.0.1 is already in use by pid {os.getpid()} (")
    assert message.endswith("; stop it or choose another port")
    assert "\n" not in message
    ensure_port_free(port)  # released: accepted now


NEVER_HEALTHY = """
    import http.server, sys
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(503); self.end_headers(); self.wfile.write(b"loading")
        def log_message(self, *a): pass
    s = http.server.HTTPServer(("127.0.0.1", 0), H)
    print("warming up forever on", s.server_address[1], flush=True)
    s.serve_forever()
"""


def test_a_replica_that_never_becomes_healthy_fails_at_the_deadline(tmp_path):
    proc = spawn("stuck", python(NEVER_HEALTHY), log_dir=tmp_path)
    try:
        port = wait_for_log_line(proc, re.compile(r"forever on (\d+)"), 10).group(1)
        t0 = time.monotonic()
        with pytest.raises(FleetError) as e:
            wait_healthy(proc, f"http://127.0.0.1:{port}/health", timeout_s=1.0)
        assert 1.0 <= time.monotonic() - t0 < 4
    finally:
        proc.stop()
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith(
        f"stuck (pid {proc.pid}) not healthy at http://127.0.0.1:{port}/health within 1s"
    )
    assert "(last: HTTP 503 loading)" in message
    assert message.endswith(f"log tail ({tmp_path / 'stuck.log'}): warming up forever on {port}")


def test_a_child_that_exits_while_starting_shows_its_log_tail(tmp_path):
    proc = spawn("crasher", python("import sys; print('bad profile: nope', flush=True); sys.exit(3)"),
                 log_dir=tmp_path)  # fmt: skip
    with pytest.raises(FleetError) as e:
        wait_healthy(proc, f"http://127.0.0.1:{free_port()}/health", timeout_s=10)
    assert str(e.value) == (
        f"crasher (pid {proc.pid}) exited with code 3; log tail ({tmp_path / 'crasher.log'}): bad profile: nope"
    )


def test_a_missing_executable_is_one_line(tmp_path):
    with pytest.raises(
        FleetError, match=r"^ghost: cannot run '/nonexistent/engine': No such file or directory$"
    ):
        spawn("ghost", ["/nonexistent/engine"], log_dir=tmp_path)
