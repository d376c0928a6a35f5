"""The capture's two processes: when the relay dies, the assembler process still settles every
exchange it was told of exactly once, writes the file and exits.

A real capture between a raw client and the sim (profile tiny, time scale 4: a 3,000-token reply
streams for seconds). One headerless conversation of three turns, each on a connection of its own,
is recorded as one session (the history-prefix key sees every exchange); a fourth request is on
the wire when the relay is killed with SIGKILL: it is cut, never recorded, and counted once.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time

from loadgen.capture.process import CaptureProcess
from workloads import load_workload

from .runs import sim

SYSTEM = {"role": "system", "content": "be brief"}


def _post(port: int, messages: list[dict], *, max_tokens: int, stream: bool) -> socket.socket:
    body = json.dumps(
        {"messages": messages, "max_tokens": max_tokens, "stream": stream, "ignore_eos": True}
    ).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body)
    )
    return s


def _read_all(s: socket.socket) -> bytes:
    got = b""
    while data := s.recv(65536):
        got += data
    s.close()
    return got


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def test_a_killed_relay_leaves_every_exchange_settled_once_and_the_file_written(tmp_path) -> None:
    out = tmp_path / "cap.jsonl"
    with sim(tmp_path, "--profile", "tiny", "--time-scale", "4", "--seed", "1") as (proc, _):
        cap = CaptureProcess.start(["--upstream", proc.url, "--out", str(out)])
        try:
            with open(f"/proc/{cap.proc.pid}/task/{cap.proc.pid}/children") as f:
                (assembler_pid,) = (int(p) for p in f.read().split())
            history = [SYSTEM]
            for k in range(3):  # a new connection per turn: only the history ties them together
                history.append({"role": "user", "content": f"question {k}"})
                reply = _read_all(_post(cap.port, history, max_tokens=4, stream=False))
                assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
                text = json.loads(reply.partition(b"\r\n\r\n")[2])["choices"][0]["message"]["content"]
                history.append({"role": "assistant", "content": text})
            history.append({"role": "user", "content": "a long one"})
            on_the_wire = _post(cap.port, history, max_tokens=3000, stream=True)
            first = on_the_wire.recv(65536)
            assert first.startswith(b"HTTP/1.1 200"), first[:200]
            while b"data:" not in first:  # a piece of the body went through the relay
                first += on_the_wire.recv(65536)
            os.kill(cap.proc.pid, signal.SIGKILL)
            cap.proc.wait(10)
            deadline = time.monotonic() + 20
            while not _gone(assembler_pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _gone(assembler_pid), "the assembler process did not finish after the relay died"
            on_the_wire.close()
        finally:
            cap.stop()
    summary = cap.output.strip().splitlines()[-1]
    assert summary == (
        f"capture: wrote 1 sessions, 3 turns to {out} (4 requests; not recorded: "
        "1 cut by the client, 0 failed upstream, 0 unreadable)"
    ), cap.output
    assert "the relay ended with 1 replies on the wire" in cap.stderr()
    wl = load_workload(str(out))
    (session,) = wl.sessions(0, wl.num_sessions)
    assert session.system_prompt == "be brief"
    assert [(t.content, t.max_tokens) for t in session.turns] == [(f"question {k}", 4) for k in range(3)]
