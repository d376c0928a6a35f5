"""How a trace's size shows in a replay: time to the first request and every process's peak memory.

Writes an Azure-format trace of N rows (``TIMESTAMP,ContextTokens,GeneratedTokens``, ISO times,
Poisson gaps of 20 ms on average), then runs a short bounded replay of it against the sim
(``loadgen run --workload FILE --num-sessions S --workers W``) and prints:

* time to the first request from the run's start ``t0`` (the clock every record is on:
  ``run.json t0_unix_s``); from the master's test start (its log's "Sending spawn jobs": before
  it, nothing has read the workload in the master) to ``t0``, which holds the master's planning
  and the workers' plan loads; and from the launch of ``loadgen run`` to ``t0`` and to the first
  request (the sim's truth log, on the same monotonic clock). All of it for a 1,000-row trace of
  the same shape too, so that what grows with the file stands apart from Python's and Locust's
  start-up;
* peak RSS (``VmHWM``) of the front (``loadgen run``), the master and each worker, sampled from
  ``/proc/<pid>/status`` over the process tree every 20 ms, and of the sim;
* each worker's plan load time (``run.json workers[].prepare_s``: from the plan's arrival to
  ready, the workload opened and the target's connection measured);
* the accounting line and the run's wall time.

Not a test. Usage: python bench/trace_scale.py [--rows 10000000] [--sessions 200] [--workers 2]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import numpy as np
import orjson

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from targets.sim.process import SimProcess  # noqa: E402

MEAN_GAP_US = 20_000
CHUNK_ROWS = 1_000_000


def write_azure_trace(path: Path, rows: int, seed: int = 1) -> None:
    """An Azure-format trace of ``rows`` rows, time-ordered, written chunk by chunk (never whole)."""
    rng = np.random.default_rng(seed)
    start = np.datetime64("2023-11-16T18:15:46.000000", "us")
    t_us = 0
    tmp = path.with_suffix(".part")
    with open(tmp, "w") as f:
        f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        for lo in range(0, rows, CHUNK_ROWS):
            n = min(CHUNK_ROWS, rows - lo)
            gaps = rng.exponential(MEAN_GAP_US, n).astype(np.int64)
            stamps = start + (t_us + np.cumsum(gaps)).astype("timedelta64[us]")
            t_us += int(gaps.sum())
            text = np.char.replace(np.datetime_as_string(stamps, unit="us"), "T", " ")
            ctx = rng.integers(16, 512, n)
            gen = rng.integers(1, 32, n)
            f.write("".join(f"{a},{b},{c}\n" for a, b, c in zip(text.tolist(), ctx.tolist(), gen.tolist(), strict=True)))
    tmp.rename(path)


def _status_kb(pid: int) -> dict[str, int]:
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmHWM", "VmRSS"):
                    out[key] = int(value.split()[0])
    except OSError:
        pass
    return out


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return kids


class TreePeaks:
    """Peak RSS of a process tree by role: the root (``front``), its child running Locust
    (``master``) and the master's children (``worker-1``, ...), sampled every ``interval_s``."""

    def __init__(self, root_pid: int, interval_s: float = 0.02) -> None:
        self.root = root_pid
        self.interval_s = interval_s
        self.peak_kb: dict[str, int] = {}
        self._names: dict[int, str] = {root_pid: "front"}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> TreePeaks:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _name(self, pid: int, parent: str) -> str:
        if pid not in self._names:
            if parent == "front":
                self._names[pid] = "master"
            else:
                self._names[pid] = f"worker-{sum(1 for n in self._names.values() if n.startswith('worker')) + 1}"
        return self._names[pid]

    def _run(self) -> None:
        while not self._stop.is_set():
            stack = [(self.root, "front")]
            while stack:
                pid, name = stack.pop()
                st = _status_kb(pid)
                if st:
                    self.peak_kb[name] = max(self.peak_kb.get(name, 0), st.get("VmHWM", 0), st.get("VmRSS", 0))
                stack += [(kid, self._name(kid, name)) for kid in _children(pid)]
            self._stop.wait(self.interval_s)


def _logged_unix(log: str, text: str) -> float:
    """The wall-clock time of the master's first log line holding ``text`` (Locust's format,
    ``[2026-12-02 00:51:45,697] host/INFO/...``, local time, to the millisecond)."""
    line = next(ln for ln in log.splitlines() if text in ln)
    stamp = line[1 : line.index("]")]
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def replay(trace: Path, tmp: Path, *, sessions: int, workers: int, time_scale: float, label: str) -> dict:
    """One bounded replay of ``trace`` against a fresh sim; its figures."""
    truth_log = tmp / f"truth-{label}.jsonl"
    results = tmp / f"results-{label}"
    sim = SimProcess.start(["--profile", "h200-llama3-8b-fp8", "--time-scale", "0", "--truth-log", str(truth_log)])
    try:
        cmd = [
            sys.executable, "-m", "loadgen", "run", "--target", sim.url, "--workload", str(trace),
            "--num-sessions", str(sessions), "--trace-time-scale", str(time_scale), "--workers", str(workers),
            "--results", str(results), "--max-schedule-lag", "1s",
        ]  # fmt: skip
        t_launch_ns = time.perf_counter_ns()
        t_launch_unix = time.time()
        env = {**os.environ, "LOADGEN_LOGLEVEL": "INFO"}  # the master's log stamps its test start
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        with TreePeaks(proc.pid) as peaks:
            out, _ = proc.communicate(timeout=900)
        wall_s = time.perf_counter_ns() / 1e9 - t_launch_ns / 1e9
        sim_peak = _status_kb(sim.proc.pid).get("VmHWM", 0)
    finally:
        sim.stop()
    if not results.is_dir():
        raise SystemExit(f"loadgen run failed (exit {proc.returncode}):\n{out[-3000:]}")
    run_dir = next(results.iterdir())
    info = orjson.loads((run_dir / "run.json").read_bytes())
    run_id = info["run_id"]  # the front's preflight requests are not the run's
    truth = [orjson.loads(line) for line in truth_log.read_bytes().splitlines() if line.strip()]
    received = [t["t_received_ns"] for t in truth if str(t["request_id"]).startswith(run_id)]
    sends = [orjson.loads(line)["t_send_us"] for line in (run_dir / "requests.jsonl").read_bytes().splitlines() if line.strip()]
    accounting = next((ln for ln in out.splitlines() if ln.startswith("loadgen accounting:")), "(no accounting line)")
    return {
        "test_start_to_t0_s": info["t0_unix_s"] - _logged_unix(out, "Sending spawn jobs"),
        "rc": proc.returncode,
        "first_from_launch_s": (min(received) - t_launch_ns) / 1e9 if received else None,
        "launch_to_t0_s": info["t0_unix_s"] - t_launch_unix,
        "first_from_t0_s": min(sends) / 1e6 if sends else None,
        "peak_mb": {k: v / 1024 for k, v in sorted(peaks.peak_kb.items())},
        "sim_peak_mb": sim_peak / 1024,
        "wall_s": wall_s,
        "accounting": accounting,
        "prepare_s": {w["slot"]: w.get("prepare_s") for w in info.get("workers", [])},
        "requests": len(received),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=10_000_000, help="rows of the generated trace")
    ap.add_argument("--sessions", type=int, default=200, help="--num-sessions of the replay")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--time-scale", type=float, default=0.5, help="--trace-time-scale of the replay")
    ap.add_argument("--dir", type=Path, default=None, help="where the trace is kept (reused when present)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="loadgen-trace-scale-") as d:
        tmp = Path(d)
        keep = args.dir or tmp
        keep.mkdir(parents=True, exist_ok=True)
        trace = keep / f"azure-{args.rows}.csv"
        t = time.perf_counter()
        if not trace.exists():
            write_azure_trace(trace, args.rows)
        print(f"trace: {trace} ({trace.stat().st_size / 2**20:.0f} MiB, {args.rows:,} rows; written in {time.perf_counter() - t:.1f} s)")
        small = tmp / "azure-1000.csv"
        write_azure_trace(small, 1000)
        for label, path in (("1k rows", small), (f"{args.rows:,} rows", trace)):
            r = replay(path, tmp, sessions=min(args.sessions, 1000), workers=args.workers, time_scale=args.time_scale, label=label.split()[0])
            peaks = ", ".join(f"{k} {v:.0f}" for k, v in r["peak_mb"].items())
            print(f"\n{label}: exit {r['rc']}, {r['requests']} requests, wall {r['wall_s']:.1f} s")
            print(f"  first request: {r['first_from_t0_s'] * 1000:.1f} ms after t0; the master's test start -> t0 "
                  f"{r['test_start_to_t0_s']:.2f} s; launch -> t0 {r['launch_to_t0_s']:.2f} s, -> first request "
                  f"{r['first_from_launch_s']:.2f} s")  # fmt: skip
            print(f"  peak RSS MB: {peaks}; sim {r['sim_peak_mb']:.0f}")
            print(f"  workers' plan load (prepare_s by slot): {r['prepare_s']}")
            print(f"  {r['accounting']}")
    print(f"\nmachine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
