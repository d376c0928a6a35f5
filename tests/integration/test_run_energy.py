"""Energy per token end to end: ``loadgen run --power-metrics embedded`` on the embedded sim, whose
/dcgm/metrics models its GPU power in dcgm-exporter's names (docs/sim.md), against the sim's own energy
counter over the same window; and exporter endpoints that are unreachable, HTML, huge or slow,
each one line in the summary and never a figure.

The truth: while the run goes, this test reads the sim's energy counter every 50 ms, so the
counter's value at the window's ends is known to within 50 ms of modelled power. loadgen reads it
once a second and interpolates linearly at the ends: where the power changes within the second
around an end (the sim's power is 75 W between steps and 700 W in one), the interpolated energy
departs from the truth by up to (700 - 75) W x 1 s / 4 per end, several percent of this window.
The arrivals are shaped so that the engine is busy across both ends (a burst covers the warm-up's
end, another the window's end and the drain after it) and idle for about a second inside the
window, so the power varies where it must (a window misplaced by a second would be off by about
20%) and not where loadgen interpolates: the measured departure is under 0.01%. 5% is the margin,
tight enough to catch a wrong unit (a factor of 1000), a missed GPU or a misplaced window.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import pairwise
from pathlib import Path

import orjson
import pytest

from targets.power import parse_power_page
from targets.scrape import http_get

from .runs import LOADGEN

MARGIN = 0.05  # see the module docstring


def _interp(samples: list[tuple[float, float]], t: float) -> float:
    for (t0, e0), (t1, e1) in pairwise(samples):
        if t0 <= t <= t1:
            return e0 + (e1 - e0) * (t - t0) / (t1 - t0)
    raise AssertionError(f"the test's own samples do not cover {t}")


def _poll(url: str, samples: list[tuple[float, float]], done: threading.Event) -> None:
    while not done.is_set():
        t = time.time()
        try:
            _, _, body = http_get(url, 1.0)
            reading = parse_power_page(body.decode())
            samples.append(((t + time.time()) / 2, sum(reading.energy_j_by_gpu.values())))
        except (OSError, ValueError):
            pass  # the fleet is stopping
        done.wait(0.05)


def test_energy_and_tokens_per_joule_match_the_sims_own_counter(tmp_path: Path) -> None:
    results = tmp_path / "results"
    trace = tmp_path / "arrivals.txt"
    trace.write_text("\n".join(f"{t / 20:.2f}" for t in (*range(0, 30), *range(80, 121))) + "\n")
    cmd = [
        *LOADGEN, "run", "--workload", "tiny", "--profile", "tiny", "--time-scale", "10", "--arrival", "trace",
        "--trace", str(trace), "--duration", "6s", "--warmup", "1s", "--seed", "5", "--results", str(results),
        "--run-id", "energy", "--power-metrics", "embedded", "--cost-per-hour", "3.0",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    samples: list[tuple[float, float]] = []
    done = threading.Event()
    poller = None
    err_lines: list[str] = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # the fleet's URL comes first, before any load
            err_lines.append(line)
            if line.startswith("embedded fleet: "):
                url = line.split()[2] + "/dcgm/metrics"
                poller = threading.Thread(target=_poll, args=(url, samples, done), daemon=True)
                poller.start()
                break
        out, err = proc.communicate(timeout=120)
    finally:
        done.set()
        proc.kill()
    err = "".join(err_lines) + err
    assert proc.returncode == 0, err[-3000:]
    run_dir = results / "energy"
    s = orjson.loads((run_dir / "summary.json").read_bytes())
    t0 = orjson.loads((run_dir / "run.json").read_bytes())["t0_unix_s"]
    w = s["window"]
    truth_j = _interp(samples, t0 + w["end_s"]) - _interp(samples, t0 + w["start_s"])
    e = s["energy"]
    assert e["method"] == "energy counter" and e["sources"][0]["failed_scrapes"] == 0, e
    assert e["energy_j"] == pytest.approx(truth_j, rel=MARGIN), (e, truth_j)
    assert e["average_power_w"] == pytest.approx(truth_j / w["length_s"], rel=MARGIN)
    # the idle gap between the bursts is inside the window: power varied, so a misplaced window shows
    assert 100 < e["average_power_w"] < 650
    tokens = s["throughput"]["output_tokens"]
    assert tokens > 0
    assert e["output_tokens_per_joule"] == pytest.approx(tokens / truth_j, rel=MARGIN)
    assert e["joules_per_1m_output_tokens"] == pytest.approx(truth_j / tokens * 1e6, rel=MARGIN)
    # tied to the run's target (the embedded fleet's label), beside its tokens per dollar
    assert s["by_target"]["sim"]["energy"]["energy_j"] == e["energy_j"]
    assert s["cost"]["output_tokens_per_usd"] > 0
    assert "energy      sim:" in out and "output tokens/J" in out
    live = orjson.loads((run_dir / "power-live.json").read_bytes())
    assert live["complete"] and live["sources"][0]["energy_j"] > 0


class _Hostile(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/html/metrics":
            self._send(b"<!doctype html><html><body>Sign in</body></html>", "text/html")
        elif self.path == "/huge/metrics":
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            chunk = b"# " + b"x" * 65_000 + b"\n"
            try:
                for _ in range(200):  # 13 MB, past the 8 MiB bound
                    self.wfile.write(chunk)
            except OSError:
                pass
        elif self.path == "/slow/metrics":
            time.sleep(5)
            self._send(b'DCGM_FI_DEV_POWER_USAGE{gpu="0"} 100\n', "text/plain")
        else:
            self._send(b"not found", "text/plain", 404)

    def _send(self, body: bytes, kind: str, status: int = 200) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except OSError:
            pass  # loadgen gave up first (the slow page): what this test wants

    def log_message(self, *_args) -> None:
        pass


def test_hostile_exporters_are_one_line_each_and_never_a_figure(tmp_path: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        import socket

        with socket.socket() as s:  # a port nothing listens on
            s.bind(("127.0.0.1", 0))
            dead = f"http://127.0.0.1:{s.getsockname()[1]}/metrics"
        flag = ",".join([dead, f"{base}/html/metrics", f"{base}/huge/metrics", f"sim={base}/slow/metrics"])
        results = tmp_path / "results"
        r = subprocess.run(
            [*LOADGEN, "run", "--workload", "tiny", "--profile", "tiny", "--time-scale", "5", "--num-sessions", "3",
             "--results", str(results), "--run-id", "hostile", "--power-metrics", flag],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        server.shutdown()
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout
    # the master's progress line shares stderr and may precede a warning on its line
    warnings = [ln[ln.index("warning: --power-metrics"):] for ln in r.stderr.splitlines() if "warning: --power-metrics" in ln]
    assert len(warnings) == 4, r.stderr  # one per endpoint, however many scrapes failed
    assert any("Connection refused" in w for w in warnings)
    assert any("no GPU power gauge" in w and "/html/" in w for w in warnings)
    assert any("over 8 MiB" in w for w in warnings)
    assert any("/slow/" in w and ("timed out" in w or "within" in w) for w in warnings)
    s = orjson.loads((results / "hostile" / "summary.json").read_bytes())
    assert s["energy"]["energy_j"] is None and s["energy"]["output_tokens_per_joule"] is None
    assert s["by_target"]["sim"]["energy"]["energy_j"] is None
    notes = [n for n in s["notes"] if n.startswith("energy:")]
    assert len(notes) == 4 and all("\n" not in n and "every scrape failed" in n for n in notes), notes
    assert r.stderr.strip().splitlines()[-1].startswith("loadgen verdict: PASS")
