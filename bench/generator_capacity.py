"""How much streaming loadgen's generator handles per CPU-second, and how well it times tokens.

Each point runs ``loadgen run`` (master + worker processes; one turn per session; paced points
open loop at the rate that keeps N streams in flight, back-to-back points closed loop with N
agents) against ``bench/sse_server.py``, a minimal OpenAI-style SSE server that is not the sim:
it writes one token chunk to every open stream per tick (``--interval-ms`` apart, or back to back)
and logs when it wrote each chunk. The server is pinned to its own core and the client to the
others when the machine has more than one. Per point it prints:

* chunks/s the server wrote in the measurement window (after a warm-up, while arrivals run);
* chunks per client CPU-second: the whole ``loadgen run`` process tree (front, master, workers),
  from each process's CPU clock (``bench/proc_cpu.py``: to the ns, where /proc counts 10 ms ticks),
  over the same window; and per worker CPU-second (workers only);
* the client's CPU share (cores: tree CPU-s per wall-s) and the busiest worker's share;
* the concurrency actually held (time-weighted open streams the server saw) against the asked;
* ITL error p50/p99 (every client gap against the server's write gap) and TTFT error p50/p99
  (client TTFT against first-chunk write minus request received), both absolute, in ms;
* the master's CPU per 1,000 requests completed in the window (what one master can serve);
* the worker's own saturation signals from run.json: event-loop lag and receive delay p99, and the
  share of token chunks that came out of one read with the stream's previous one (coalesced: their
  gap is lost, which is what an ITL error p99 of one token interval means);
* whether the run raised the saturation flag (``flagged``: the worker's own signals over their
  bounds, exit code 4);
* a worker's wake-ups per second (the voluntary context switches of its main thread: each a sleep
  and a wake) and its CPU per wake-up: at a light load the wake-ups, not the chunks, are the cost
  (docs/performance.md, "Wake-ups").

Not a test: figures, for docs/performance.md. Examples:

    .venv/bin/python bench/generator_capacity.py                      # 10, 100, 500, 1000 streams; 10 ms and back to back
    .venv/bin/python bench/generator_capacity.py -c 500 --pace 10ms   # one point
    .venv/bin/python bench/generator_capacity.py -c 1000 --pace b2b --workers 2 --no-pin
    .venv/bin/python bench/generator_capacity.py -c 500 --pace 10ms --connections per-session --connections pooled

bench/generator_capacity_sim.py keeps the older points against the simulated engine.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import orjson
import psutil
from proc_cpu import process_cpu_s

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from loadgen.config import CONNECTION_MODES  # noqa: E402

SPEC = """\
name: bench-stream
description: one turn, short prompt, fixed-length reply - chunk-dominated traffic for the benchmark
system_prompt_tokens: 0
turns: 1
user_tokens: 32
output_tokens: {tokens}
think_time: 0
"""


class TreeCpu:
    """Samples the CPU seconds (user + system) of a process and all its descendants, per pid."""

    def __init__(self, root_pid: int, period_s: float = 0.05) -> None:
        self.root = root_pid
        self.period_s = period_s
        self.samples: list[tuple[int, dict[int, float]]] = []  # (perf_counter_ns, {pid: cpu_s})
        # (perf_counter_ns, {pid: wake-ups}): the voluntary context switches of each process's main
        # thread, each one a sleep and a wake-up (docs/performance.md, "Wake-ups").
        self.wake_samples: list[tuple[int, dict[int, float]]] = []
        self.parents: dict[int, int] = {}
        self._last: dict[int, float] = {}
        self._last_wakes: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        try:
            root = psutil.Process(self.root)
        except psutil.NoSuchProcess:
            return
        while not self._stop.is_set():
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                break
            for p in procs:
                try:
                    self._last[p.pid] = process_cpu_s(p)
                    self._last_wakes[p.pid] = float(p.num_ctx_switches().voluntary)
                    self.parents.setdefault(p.pid, p.ppid())
                except psutil.NoSuchProcess:
                    pass  # its last sample stands
            now = time.perf_counter_ns()
            self.samples.append((now, dict(self._last)))
            self.wake_samples.append((now, dict(self._last_wakes)))
            self._stop.wait(self.period_s)

    def depth(self, pid: int) -> int:
        d = 0
        while pid != self.root and pid in self.parents:
            pid = self.parents[pid]
            d += 1
        return d

    def cpu_between(self, t_a_ns: int, t_b_ns: int, pids: set[int] | None = None) -> float:
        """CPU seconds the (selected) processes used between two instants, interpolated."""
        return self._between(self.samples, t_a_ns, t_b_ns, pids)

    def wakes_between(self, t_a_ns: int, t_b_ns: int, pids: set[int] | None = None) -> float:
        """Wake-ups of the (selected) processes' main threads between two instants, interpolated."""
        return self._between(self.wake_samples, t_a_ns, t_b_ns, pids)

    @staticmethod
    def _between(samples: list, t_a_ns: int, t_b_ns: int, pids: set[int] | None) -> float:
        def at(t_ns: int) -> float:
            ts = [s[0] for s in samples]
            i = int(np.searchsorted(ts, t_ns))
            i = min(max(i, 1), len(samples) - 1)
            (t0, c0), (t1, c1) = samples[i - 1], samples[i]
            v0 = sum(v for p, v in c0.items() if pids is None or p in pids)
            v1 = sum(v for p, v in c1.items() if pids is None or p in pids)
            f = 0.0 if t1 == t0 else min(1.0, max(0.0, (t_ns - t0) / (t1 - t0)))
            return v0 + f * (v1 - v0)

        return at(t_b_ns) - at(t_a_ns)


def start_server(log: Path, interval_ms: float, cpu: int | None) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, str(REPO / "bench" / "sse_server.py"), "--port", "0",
           "--interval-ms", str(interval_ms), "--log", str(log)]  # fmt: skip
    if cpu is not None:
        cmd += ["--cpu", str(cpu)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline() if proc.stdout else ""
    if not line.startswith("READY "):
        proc.kill()
        raise RuntimeError(f"bench server did not start: {line!r}")
    return proc, f"http://127.0.0.1:{line.split()[1]}"


def stop_server(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_point(tmp: Path, streams: int, interval_ms: float, tokens: int, duration_s: float, warmup_s: float,
              workers: int, pin: bool, connections: str = "pooled") -> dict:  # fmt: skip
    name = f"{streams}-{interval_ms:g}-{workers}-{connections}"
    truth_log, results = tmp / f"truth-{name}.jsonl", tmp / f"results-{name}"
    spec = tmp / f"spec-{tokens}.yaml"
    spec.write_text(SPEC.format(tokens=tokens))
    cores = sorted(os.sched_getaffinity(0))
    server_cpu = cores[-1] if pin and len(cores) > 1 else None
    client_cpus = set(cores[:-1]) if server_cpu is not None else None
    server, url = start_server(truth_log, interval_ms, server_cpu)
    try:
        if interval_ms:
            # Paced: open loop at the rate that keeps `streams` in flight. Closed-loop agents that
            # finish on the same tick all start again at once, and that burst (not steady state)
            # is what such a point would time.
            load = ["--rate", f"{streams / (tokens * interval_ms / 1000.0):.3f}"]
        else:
            load = ["--concurrency", str(streams)]
        cmd = [
            sys.executable, "-m", "loadgen", "run", "--target", url, "--workload", str(spec), *load,
            "--duration", f"{duration_s:g}s", "--workers", str(workers),
            "--results", str(results), "--request-timeout", "120s", "--connections", connections,
        ]  # fmt: skip
        client = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            preexec_fn=(lambda: os.sched_setaffinity(0, client_cpus)) if client_cpus else None,
        )  # fmt: skip
        if server_cpu is not None:
            # This process (its CPU sampler above all) keeps off the client's cores: it measures
            # the client and must not take its CPU. The server's core can spare it.
            os.sched_setaffinity(0, {server_cpu})
        cpu = TreeCpu(client.pid)
        cpu.start()
        _out, err = client.communicate(timeout=duration_s + 300)
        cpu.stop()
    finally:
        os.sched_setaffinity(0, cores)
        stop_server(server)
    if client.returncode not in (0, 4):
        raise RuntimeError(f"loadgen run failed ({client.returncode}): {err.decode()[-2000:]}")
    r = measure(truth_log, next(results.iterdir()), cpu, streams, warmup_s, duration_s)
    # The flag itself, under the default bounds a user's run gets: exit 4, the generator saturated.
    r["saturated"] = client.returncode == 4
    return r


def measure(truth_log: Path, run_dir: Path, cpu: TreeCpu, streams: int, warmup_s: float, duration_s: float) -> dict:
    truth = {}
    for line in truth_log.read_bytes().splitlines():
        t = orjson.loads(line)
        if not t["request_id"].startswith("loadgen-preflight"):  # the check before load
            truth[t["request_id"]] = t
    start_ns = min(t["t_received_ns"] for t in truth.values())
    t_a, t_b = start_ns + int(warmup_s * 1e9), start_ns + int(duration_s * 1e9)
    writes = np.concatenate([np.asarray(t["t_chunks_ns"], dtype=np.int64) for t in truth.values()])
    chunks = int(((writes >= t_a) & (writes < t_b)).sum())
    # Open streams over the window, time-weighted (server view: request received .. last write).
    opens = np.asarray([t["t_received_ns"] for t in truth.values()], dtype=np.int64)
    ends = np.asarray([t["t_end_ns"] for t in truth.values()], dtype=np.int64)
    overlap = np.clip(np.minimum(ends, t_b) - np.maximum(opens, t_a), 0, None)
    held = float(overlap.sum()) / (t_b - t_a)
    wall_s = (t_b - t_a) / 1e9
    tree_cpu = cpu.cpu_between(t_a, t_b)
    # Workers are the processes two levels below `loadgen run`: it starts Locust's master, which forks them.
    worker_pids = {p for p in cpu.parents if cpu.depth(p) == 2}
    worker_cpu = cpu.cpu_between(t_a, t_b, worker_pids)
    busiest = max((cpu.cpu_between(t_a, t_b, {p}) for p in worker_pids), default=float("nan"))
    worker_wakes = cpu.wakes_between(t_a, t_b, worker_pids)
    master_pids = {p for p in cpu.parents if cpu.depth(p) == 1}  # Locust's master: merges, writes
    master_cpu = cpu.cpu_between(t_a, t_b, master_pids)
    done_in_window = int(((ends >= t_a) & (ends < t_b)).sum())
    itl_err, ttft_err, errors, n = [], [], 0, 0
    for line in (run_dir / "requests.jsonl").read_bytes().splitlines():
        rec = orjson.loads(line)
        n += 1
        t = truth.get(rec["request_id"])
        if rec["status"] != "ok" or t is None:
            errors += 1
            continue
        gaps = np.diff(np.asarray(t["t_chunks_ns"], dtype=np.int64)) / 1000.0
        if len(gaps) == len(rec["itl_us"]):
            itl_err.append(np.abs(np.asarray(rec["itl_us"], dtype=float) - gaps))
        true_ttft_us = (t["t_chunks_ns"][0] - t["t_received_ns"]) / 1000.0
        ttft_err.append(abs((rec["t_first_us"] - rec["t_send_us"]) - true_ttft_us))
    health = orjson.loads((run_dir / "run.json").read_bytes()).get("generator") or {}
    itl = np.concatenate(itl_err) / 1000.0 if itl_err else np.array([np.nan])
    ttft = np.asarray(ttft_err) / 1000.0 if ttft_err else np.array([np.nan])
    return {
        "streams": streams, "held": held, "requests": n, "errors": errors,
        "chunks_per_s": chunks / wall_s,
        "chunks_per_cpu_s": chunks / tree_cpu if tree_cpu > 0 else float("nan"),
        "chunks_per_worker_cpu_s": chunks / worker_cpu if worker_cpu > 0 else float("nan"),
        "client_cores": tree_cpu / wall_s, "worker_share": busiest / wall_s,
        # Per worker: how often its loop slept and was woken, and its CPU per wake-up.
        "worker_wakes_per_s": worker_wakes / wall_s / max(1, len(worker_pids)),
        "worker_cpu_us_per_wake": 1e6 * worker_cpu / worker_wakes if worker_wakes > 0 else float("nan"),
        "master_cpu_ms_per_1k_requests": 1e6 * master_cpu / done_in_window if done_in_window else float("nan"),
        "master_cpu_ms_per_100k_chunks": 1e8 * master_cpu / chunks if chunks else float("nan"),
        "itl_p50_ms": float(np.percentile(itl, 50)), "itl_p99_ms": float(np.percentile(itl, 99)),
        "ttft_p50_ms": float(np.percentile(ttft, 50)), "ttft_p99_ms": float(np.percentile(ttft, 99)),
        # The worker's own saturation signals (loadgen/engine/health.py), p99 in ms.
        "loop_lag_p99_ms": (health.get("loop_lag_ms") or {}).get("p99"),
        "recv_delay_p99_ms": (health.get("recv_delay_ms") or {}).get("p99"),
        # Token chunks that came out of one read with the stream's previous one (their gap lost).
        "coalesced_share": (health.get("coalescing") or {}).get("share"),
        # The worker's collections by the clock (loadgen/engine/worker_gc.py): their time in all,
        # per second of arrivals (the whole run's, not only the window's).
        "gc_ms_per_s": ((health.get("gc") or {}).get("pause_total_ms") or 0.0) / duration_s,
    }  # fmt: skip


def floor_point(streams: int, interval_ms: float) -> float:
    """bench/gevent_floor.py's "one reader + json" at this point: chunks per CPU-second of a bare
    gevent loop that reads every stream from one epoll set and parses each chunk with orjson."""
    cmd = [sys.executable, str(Path(__file__).with_name("gevent_floor.py")), "-c", str(streams),
           "--pace", str(interval_ms), "-d", "4", "-w", "2", "--mode", "one reader + json", "--json"]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True).stdout
    for line in out.splitlines():
        if line.startswith("{"):
            return float(orjson.loads(line)["chunks_per_cpu_s"])
    raise RuntimeError(f"bench/gevent_floor.py printed no figure: {out[-500:]}")


def _pace(text: str) -> float:
    if text in ("b2b", "0", "0ms"):
        return 0.0
    return float(text.removesuffix("ms"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-c", "--streams", type=int, action="append", help="concurrent streams (repeatable; default 10, 100, 500, 1000)")
    ap.add_argument("--pace", action="append", help="time between tokens: 10ms, b2b (back to back); repeatable (default both)")
    ap.add_argument("-d", "--duration", type=float, default=4.0, help="arrivals run this long per point, s")
    ap.add_argument("-w", "--warmup", type=float, default=1.0, help="excluded from the window, s")
    ap.add_argument("--tokens", type=int, default=100, help="tokens per request (paced)")
    ap.add_argument("--b2b-tokens", type=int, default=256, help="tokens per request (back to back)")
    ap.add_argument("--workers", type=int, default=1, help="loadgen worker processes")
    ap.add_argument("--connections", action="append", choices=CONNECTION_MODES,
                    help="loadgen run's --connections; repeatable: each point runs in each mode, one after the "
                         "other (default pooled)")  # fmt: skip
    ap.add_argument("--no-pin", action="store_true", help="don't pin server and client to separate cores")
    ap.add_argument("--json", action="store_true", help="also print each point as a JSON line")
    ap.add_argument("--floor", action="store_true",
                    help="after each point, bench/gevent_floor.py's one reader + json at the same streams and "
                         "pace: the worker's figure as a share of it, measured minutes apart (this ratio "
                         "moves far less than the figures when the machine's speed drifts)")  # fmt: skip
    args = ap.parse_args()
    streams = args.streams or [10, 100, 500, 1000]
    paces = [_pace(p) for p in (args.pace or ["10ms", "b2b"])]
    modes = args.connections or ["pooled"]
    print(f"loadgen run x {args.workers} worker(s) vs bench/sse_server.py; {args.duration:g} s points, "
          f"{args.warmup:g} s warm-up; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")  # fmt: skip
    print(f"{'streams':>7} {'pace':>6} {'connections':>11} {'held':>6} {'chunks/s':>9} {'/client-CPU-s':>13} {'/worker-CPU-s':>13} "
          f"{'client':>7} {'worker':>7} {'ITL err p50/p99 ms':>19} {'TTFT err p50/p99 ms':>20} {'err':>4} "
          f"{'master ms/1k req':>16} {'loop lag/recv delay p99 ms':>26} {'coalesced':>9} "
          f"{'wakes/s':>8} {'us/wake':>8} {'gc ms/s':>7} {'flagged':>7}" + (f" {'floor /CPU-s':>12} {'worker/floor':>12}" if args.floor else ""))  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="loadgen-bench-") as d:
        for interval_ms in paces:
            for c, mode in ((c, m) for c in streams for m in modes):
                tokens = args.tokens if interval_ms else args.b2b_tokens
                # Open-loop streams ramp up over one reply's length: the window starts after it.
                warmup = max(args.warmup, tokens * interval_ms / 1000.0)
                duration = max(args.duration, warmup + 3.0)
                r = run_point(Path(d), c, interval_ms, tokens, duration, warmup, args.workers, not args.no_pin, mode)
                if args.floor:
                    r["floor_chunks_per_cpu_s"] = floor_point(c, interval_ms)
                pace = f"{interval_ms:g}ms" if interval_ms else "b2b"
                print(
                    f"{c:>7} {pace:>6} {mode:>11} {r['held']:>6.0f} {r['chunks_per_s']:>9,.0f} {r['chunks_per_cpu_s']:>13,.0f} "
                    f"{r['chunks_per_worker_cpu_s']:>13,.0f} {r['client_cores']:>6.0%} {r['worker_share']:>6.0%} "
                    f"{r['itl_p50_ms']:>9.3f}/{r['itl_p99_ms']:<9.3f} {r['ttft_p50_ms']:>9.3f}/{r['ttft_p99_ms']:<9.3f} "
                    f"{r['errors']:>4} {r['master_cpu_ms_per_1k_requests']:>16,.0f} "
                    f"{r['loop_lag_p99_ms'] or float('nan'):>12.2f}/{r['recv_delay_p99_ms'] or float('nan'):<13.2f} "
                    f"{r['coalesced_share'] if r['coalesced_share'] is not None else float('nan'):>9.2%} "
                    f"{r['worker_wakes_per_s']:>8,.0f} {r['worker_cpu_us_per_wake']:>8,.0f} {r['gc_ms_per_s']:>7.1f} "
                    f"{'yes' if r['saturated'] else 'no':>7}"
                    + (f" {r['floor_chunks_per_cpu_s']:>12,.0f} "
                       f"{r['chunks_per_worker_cpu_s'] / r['floor_chunks_per_cpu_s']:>12.2f}" if args.floor else ""),
                    flush=True,
                )  # fmt: skip
                if args.json:
                    print(orjson.dumps({"pace_ms": interval_ms, "workers": args.workers, "connections": mode, **r}).decode(), flush=True)


if __name__ == "__main__":
    main()
