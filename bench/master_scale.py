"""What one master costs at 4, 16 and 32 workers on one machine, at the same light load.

For each worker count N it starts the simulated engine (once), a headless master and
``loadgen worker --processes N`` on 127.0.0.1, runs the ``tiny`` workload at the same total rate
(a few sessions a second: what grows with N is the master's per-worker work, not the load), and
prints, over a steady window of the run (after its first seconds, before its last):

* the master's CPU seconds per 1,000 requests recorded, and its CPU share of one core;
* the master's time per worker report merged (``MasterRuntime._merge``: histogram deltas and
  records, written on receipt) and per flush (``_collect``: one hlog interval, every second);
* the master's memory: RSS at the end of the window, and its peak (VmHWM).

Not a test: figures for docs/distributed.md. The merge and flush times come from inside the
master: this file is also the master's locustfile (loadgen's, plus timers around those two calls).

    .venv/bin/python bench/master_scale.py                    # 4, 16, 32 workers, 30 s each
    .venv/bin/python bench/master_scale.py --workers 32 --duration 45s
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROBE_ENV = "MASTER_SCALE_PROBE_FILE"
# (--worker-loss-timeout, --master-loss-timeout). Dozens of workers on a machine with a few cores
# each spend ~0.5 s of CPU on Locust's start message at once: on 2 cores, 32 of them keep every
# heartbeat waiting for ~8 s, past the default 5 s, and the master would count them all lost.
LOSS_TIMEOUTS = ("30s", "60s")


def _probe_master() -> None:
    """Loaded by Locust as the master's locustfile: loadgen's, with the merge and flush timed."""
    import orjson
    from locust import events

    from loadgen.locustfile import LLMDriverUser  # registers loadgen's options and runtime

    globals()["LLMDriverUser"] = LLMDriverUser  # the user class the workers run too
    merge_s: list[tuple[float, int]] = []  # (seconds, records in the report) per report merged
    collect_s: list[tuple[float, int]] = []

    def timed(fn, into: list[tuple[float, int]]):
        def call(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                delta = args[0] if args else None
                into.append((time.perf_counter() - t, len(getattr(delta, "records", None) or ())))

        return call

    @events.init.add_listener
    def _time_merges(environment, **_kw) -> None:
        rt = environment.loadgen  # installed by loadgen's own init listener, registered before this one
        rt._merge = timed(rt._merge, merge_s)
        rt._collect = timed(rt._collect, collect_s)

    @events.quitting.add_listener
    def _write(environment, **_kw) -> None:
        path = os.environ.get(PROBE_ENV)
        if path:
            Path(path).write_bytes(orjson.dumps({"merge_s": merge_s, "collect_s": collect_s}))


if __name__ != "__main__":
    _probe_master()


def _count_lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _percentile(values: list[float], p: float) -> float:
    import numpy as np

    return float(np.percentile(np.asarray(values), p)) if values else float("nan")


def run_point(url: str, n_workers: int, rate: str, duration_s: float, tmp: Path) -> dict[str, float]:
    import orjson
    import psutil

    from targets.fleet.procs import free_port

    port = free_port()
    results, run_id = tmp / "results", f"scale-{n_workers}"
    run_dir = results / run_id
    probe = tmp / f"probe-{n_workers}.json"
    env = {**os.environ, PROBE_ENV: str(probe), "PYTHONPATH": str(REPO)}
    env.pop("LOADGEN_JOIN_SECRET", None)
    master_cmd = [
        sys.executable, "-m", "locust", "-f", __file__, "--master", "--headless", "--only-summary",
        "--expect-workers", str(n_workers), "-u", str(n_workers), "-r", str(n_workers),
        "--master-bind-host", "127.0.0.1", "--master-bind-port", str(port), "--loglevel", "WARNING",
        "--host", url, "--workload", "tiny", "--seed", "1", "--rate", rate, "--duration", f"{duration_s:g}s",
        "--results", str(results), "--run-id", run_id, "--max-schedule-lag", "30s",
        "--worker-loss-timeout", LOSS_TIMEOUTS[0],
    ]  # fmt: skip
    worker_cmd = [sys.executable, "-m", "loadgen", "worker", "--master-host", "127.0.0.1", "--master-port", str(port)]
    worker_cmd += ["--processes", str(n_workers), "--master-loss-timeout", LOSS_TIMEOUTS[1]]
    log = (tmp / f"master-{n_workers}.log").open("wb")
    master = subprocess.Popen(master_cmd, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    workers = subprocess.Popen(worker_cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        t_start = time.monotonic()
        while not (run_dir / "run.json").exists() or not orjson.loads((run_dir / "run.json").read_bytes()).get("workers"):
            if master.poll() is not None or time.monotonic() - t_start > 180:
                log.flush()
                tail = Path(log.name).read_text()[-2000:]
                raise SystemExit(f"the master with {n_workers} workers did not start (exit {master.poll()}):\n{tail}")
            time.sleep(0.2)
        t0 = orjson.loads((run_dir / "run.json").read_bytes())["t0_unix_s"]
        proc = psutil.Process(master.pid)
        # A steady window: after the first 3 s (start-up, first reports), before the last 2 s.
        time.sleep(max(0.0, t0 + 3.0 - time.time()))
        cpu_a, rec_a, wall_a = sum(proc.cpu_times()[:2]), _count_lines(run_dir / "requests.jsonl"), time.monotonic()
        time.sleep(max(0.0, t0 + duration_s - 2.0 - time.time()))
        cpu_b, rec_b, wall_b = sum(proc.cpu_times()[:2]), _count_lines(run_dir / "requests.jsonl"), time.monotonic()
        rss_mib = proc.memory_info().rss / 2**20
        peak_mib = _peak_rss_mib(master.pid)
        master.wait(timeout=120)
    finally:
        for p in (master, workers):
            if p.poll() is None:
                p.terminate()
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        log.close()
    timings = orjson.loads(probe.read_bytes()) if probe.exists() else {"merge_s": [], "collect_s": []}
    info = orjson.loads((run_dir / "run.json").read_bytes())
    requests = rec_b - rec_a
    cpu_s = cpu_b - cpu_a
    merges = [t for t, _n in timings["merge_s"]]
    with_records = [t for t, n in timings["merge_s"] if n]
    collects = [t for t, _n in timings["collect_s"]]
    return {
        "workers": n_workers,
        "slots": len(info.get("workers") or []),
        "lost": len(info.get("lost_workers") or []),
        "lost_why": sorted({str(w.get("why")) for w in info.get("lost_workers") or []}),
        "requests_in_window": requests,
        "window_s": wall_b - wall_a,
        "cpu_ms_per_1k_requests": 1e6 * cpu_s / requests if requests else float("nan"),
        "master_cores": cpu_s / (wall_b - wall_a),
        "reports_merged": len(merges),
        "merge_ms_mean": 1e3 * sum(merges) / len(merges) if merges else float("nan"),
        "merge_ms_p99": 1e3 * _percentile(merges, 99),
        "reports_with_records": len(with_records),
        "merge_with_records_ms_p50": 1e3 * _percentile(with_records, 50),
        "merge_with_records_ms_p99": 1e3 * _percentile(with_records, 99),
        "flush_ms_p50": 1e3 * _percentile(collects, 50),
        "flush_ms_p99": 1e3 * _percentile(collects, 99),
        "rss_mib": rss_mib,
        "peak_rss_mib": peak_mib,
    }


def main() -> int:
    sys.path.insert(0, str(REPO))
    from analysis.units import parse_duration_s
    from targets.sim.process import SimProcess

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="4,16,32", help="worker counts, comma-separated")
    ap.add_argument("--rate", default="8", help="total session arrivals per second (the same at every count)")
    ap.add_argument("--duration", default="30s", help="arrivals per point, e.g. 45s")
    args = ap.parse_args()
    counts = [int(x) for x in args.workers.split(",") if x.strip()]
    duration_s = parse_duration_s(args.duration)
    print(f"machine: {os.cpu_count()} CPUs (shared with whatever else runs); rate {args.rate}/s, {duration_s:g} s per point")
    rows = []
    with tempfile.TemporaryDirectory(prefix="master-scale-") as d:
        sim = SimProcess.start(["--profile", "h200-llama3-8b-fp8", "--seed", "1"])
        try:
            for n in counts:
                rows.append(run_point(sim.url, n, args.rate, duration_s, Path(d)))
                r = rows[-1]
                print(
                    f"{r['workers']:>3} workers ({r['slots']} slots, {r['lost']} lost{': ' if r['lost'] else ''}"
                    f"{', '.join(r['lost_why'])}): "
                    f"{r['cpu_ms_per_1k_requests']:,.0f} ms CPU / 1k requests ({r['requests_in_window']} in "
                    f"{r['window_s']:.0f} s), {r['master_cores']:.1%} of a core; "
                    f"merge {r['merge_ms_mean']:.2f} ms mean, {r['merge_ms_p99']:.2f} p99 over {r['reports_merged']} reports "
                    f"({r['reports_with_records']} with records: {r['merge_with_records_ms_p50']:.2f}/"
                    f"{r['merge_with_records_ms_p99']:.2f} ms p50/p99); "
                    f"flush {r['flush_ms_p50']:.2f}/{r['flush_ms_p99']:.2f} ms; "
                    f"RSS {r['rss_mib']:.0f} MiB (peak {r['peak_rss_mib']:.0f})",
                    flush=True,
                )
        finally:
            sim.stop()
    if len(rows) > 1:
        base = rows[0]
        for r in rows[1:]:
            print(
                f"{r['workers']} vs {base['workers']} workers: CPU/1k requests x{r['cpu_ms_per_1k_requests'] / base['cpu_ms_per_1k_requests']:.2f}, "
                f"master cores x{r['master_cores'] / base['master_cores']:.2f}, RSS x{r['rss_mib'] / base['rss_mib']:.2f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
