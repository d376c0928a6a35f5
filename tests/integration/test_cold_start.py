"""Cold start of launched processes: measured phases against a stand-in server's own clock, and
``loadgen serve sim --measure-cold-start``."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

from targets.fleet.coldstart import ColdStartWatch
from targets.fleet.procs import spawn, stop_all
from tests.conftest import free_port

from .runs import loadgen

# The watch polls every 5 ms; the margin also covers a busy 2-core machine delaying its thread.
MARGIN_S = 0.1

# Listens after 0.3 s, answers /health 503 for 0.3 s more, then 200; streams its first token
# 0.2 s after a chat request arrives. It notes on the shared monotonic clock when each happened.
STAND_IN = textwrap.dedent(
    """
    import json, os, sys, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    port, truth_path = int(sys.argv[1]), sys.argv[2]
    truth = {}
    time.sleep(0.3)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            ready = time.monotonic() >= truth["listening"] + 0.3
            if ready:
                truth.setdefault("healthy", time.monotonic())
            self.send_response(200 if ready else 503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            time.sleep(0.2)
            truth.setdefault("first_token", time.monotonic())
            self.wfile.write(b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\\n\\n')
            self.wfile.flush()
            # Complete on disk before the stream ends: the watch is done once it sees [DONE].
            with open(truth_path + ".tmp", "w") as f:
                json.dump(truth, f)
            os.replace(truth_path + ".tmp", truth_path)
            self.wfile.write(b"data: [DONE]\\n\\n")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    truth["listening"] = time.monotonic()
    server.serve_forever()
    """
)


def test_phases_match_the_servers_own_clock(tmp_path: Path):
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    port, truth_file = free_port(), tmp_path / "truth.json"
    proc = spawn("stand-in", [sys.executable, str(script), str(port), str(truth_file)], log_dir=tmp_path)
    try:
        watch = ColdStartWatch(proc, role="replica", port=port, timeout_s=20.0)
        got = watch.wait(20.0)
    finally:
        stop_all([proc])
    assert got.error is None, got
    truth = json.loads(truth_file.read_text())
    for phase, key in (("listening_s", "listening"), ("healthy_s", "healthy"), ("first_token_s", "first_token")):
        true_s = truth[key] - proc.launched_at
        assert true_s <= getattr(got, phase) <= true_s + MARGIN_S, (phase, true_s, got)
    assert got.url == f"http://127.0.0.1:{port}" and got.role == "replica" and got.name == "stand-in"


def test_a_process_that_exits_leaves_the_rest_unmeasured(tmp_path: Path):
    proc = spawn("quitter", [sys.executable, "-c", "import sys; sys.exit(3)"], log_dir=tmp_path)
    got = ColdStartWatch(proc, role="replica", port=free_port(), timeout_s=10.0).wait(10.0)
    stop_all([proc])
    assert (got.listening_s, got.healthy_s, got.first_token_s) == (None, None, None)
    assert got.error == "exited before listening"


def test_serve_sim_measure_cold_start_prints_each_phase(tmp_path: Path):
    r = loadgen("serve", "sim", "--profile", "tiny", "--time-scale", "0", "--measure-cold-start", "2", timeout_s=60)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.strip().splitlines()
    assert lines[0] == "cold start over 2 launches (seconds from launch; p50 / max)"
    assert lines[1].split()[0] == "process" and len(lines) == 3, r.stdout
    cells = lines[2].split()
    assert cells[0] == "sim-0"
    listening, healthy, first = (float(cells[i]) for i in (1, 4, 7))
    # A sim starts a Python interpreter: well over a few ms, well under the startup deadline.
    assert 0.05 < listening <= healthy <= first < 30.0
