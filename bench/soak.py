"""Soak: a long distributed run at a steady rate, watching for leaks and lost records.

Starts a sim on 127.0.0.1 (with its truth log), ``loadgen master --headless`` and two
``loadgen worker`` processes, runs for ``--minutes`` at ``--rate`` sessions/s, and prints once a
minute, for the master's and each worker's Locust process and for the sim:

  RSS (MiB), open file descriptors, and the records the master wrote per second since the last line

At the end it compares the records with the sim's truth log and prints the verdict lines:

  RSS growth from minute ``--settle`` to the end < 10% for each loadgen process
  no fd growth: the second half's lowest count of open fds is not above the first half's highest
  lost records = 0: every request the sim served for the run is in requests.jsonl exactly once

Exit 0 when every target holds, 1 otherwise. Not a test: it takes as long as asked.

    .venv/bin/python bench/soak.py                       # 30 minutes at 4 sessions/s
    .venv/bin/python bench/soak.py --minutes 6 --rate 2  # a quick look
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import orjson
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from targets.sim.process import SimProcess

LOADGEN = [sys.executable, "-m", "loadgen"]
RUN_ID = "soak"
RSS_GROWTH_LIMIT = 0.10
# The run's own stop (its --duration, then the drain) plus start-up; past this the soak gives up.
END_GRACE_S = 120.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [*LOADGEN, *args], stdout=log.open("wb"), stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )


def locust_child(wrapper: subprocess.Popen, timeout_s: float = 60.0) -> psutil.Process:
    """The Locust process that a ``loadgen master``/``worker`` runs as its child."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        children = psutil.Process(wrapper.pid).children()
        if children:
            return children[0]
        if wrapper.poll() is not None:
            break
        time.sleep(0.1)
    raise SystemExit(f"soak: {wrapper.args[2:4]} started no Locust process")


def count_lines(path: Path) -> int:
    try:
        with path.open("rb") as f:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    except FileNotFoundError:
        return 0


def sample(procs: dict[str, psutil.Process]) -> dict[str, tuple[float, int]]:
    """(RSS MiB, open fds) per process; a process that is gone reads (0, 0)."""
    out = {}
    for name, p in procs.items():
        try:
            out[name] = (p.memory_info().rss / 2**20, p.num_fds())
        except psutil.NoSuchProcess:
            out[name] = (0.0, 0)
    return out


def compare_with_truth(run_dir: Path, truth_log: Path) -> tuple[int, int, int, int, int]:
    """(recorded, served ok by the sim, served but not recorded, recorded twice, recorded but not served)."""
    recorded = Counter()
    for line in (run_dir / "requests.jsonl").read_bytes().splitlines():
        if line.strip():
            recorded[orjson.loads(line)["request_id"]] += 1
    served = set()
    for line in truth_log.read_bytes().splitlines():
        if line.strip():
            t = orjson.loads(line)
            if t["request_id"].startswith(f"{RUN_ID}-") and t["outcome"] == "ok":
                served.add(t["request_id"])
    twice = sum(1 for c in recorded.values() if c > 1)
    return sum(recorded.values()), len(served), len(served - set(recorded)), twice, len(set(recorded) - served)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30.0, help="length of the run")
    ap.add_argument("--rate", type=float, default=4.0, help="session arrivals per second")
    ap.add_argument("--workload", default="tiny")
    ap.add_argument("--settle", type=float, default=5.0, help="minutes before the RSS baseline is taken")
    ap.add_argument("--interval", type=float, default=60.0, help="seconds between lines")
    ap.add_argument("--dir", default=None, help="where results and logs go (default: a temporary directory)")
    args = ap.parse_args()
    # SIGTERM unwinds like Ctrl-C: the finally below stops the master, the workers and the sim.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    work = Path(args.dir or tempfile.mkdtemp(prefix="loadgen-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    results, truth_log = work / "results", work / "truth.jsonl"
    print(f"soak: {args.minutes:g} min at {args.rate:g} sessions/s, workload {args.workload}; files in {work}", flush=True)
    sim = SimProcess.start(["--profile", "h200-llama3-8b-fp8", "--seed", "1", "--truth-log", str(truth_log)])
    wrappers: list[subprocess.Popen] = []
    try:
        port = free_port()
        wrappers.append(start([
            "master", "--headless", "--expect-workers", "2", "--master-port", str(port), "--target", sim.url,
            "--workload", args.workload, "--rate", str(args.rate), "--duration", f"{args.minutes * 60:g}s",
            "--seed", "1", "--results", str(results), "--run-id", RUN_ID, "--max-schedule-lag", "10s",
        ], work / "master.log"))  # fmt: skip
        wrappers += [start(["worker", "--master-host", "127.0.0.1", "--master-port", str(port)], work / f"worker{i}.log") for i in (1, 2)]
        procs = {"master": locust_child(wrappers[0])}
        procs.update({f"worker{i}": locust_child(w) for i, w in enumerate(wrappers[1:], start=1)})
        procs["sim"] = psutil.Process(sim.pid)
        requests_file = results / RUN_ID / "requests.jsonl"

        names = list(procs)
        print("min  " + "  ".join(f"{n + ' MiB':>12} {'fds':>4}" for n in names) + "  records/s  total", flush=True)
        t_start = time.monotonic()
        history: list[tuple[float, dict[str, tuple[float, int]]]] = []
        last_n, last_t = 0, t_start
        deadline = t_start + args.minutes * 60 + END_GRACE_S
        while wrappers[0].poll() is None and time.monotonic() < deadline:
            time.sleep(max(0.0, min(args.interval, deadline - time.monotonic())))
            if wrappers[0].poll() is not None:
                break
            now, n = time.monotonic(), count_lines(requests_file)
            s = sample(procs)
            history.append(((now - t_start) / 60, s))
            rate = (n - last_n) / (now - last_t)
            last_n, last_t = n, now
            cols = "  ".join(f"{s[k][0]:12.1f} {s[k][1]:4d}" for k in names)
            print(f"{(now - t_start) / 60:4.1f} {cols}  {rate:9.1f}  {n}", flush=True)
        code = wrappers[0].wait(timeout=max(1.0, deadline - time.monotonic()))
        tail = (work / "master.log").read_text(errors="replace").strip().splitlines()[-1:]
        print(f"master exit {code}: {tail[0] if tail else ''}", flush=True)
    finally:
        for w in wrappers:
            if w.poll() is None:
                w.terminate()
        for w in wrappers:
            try:
                w.wait(timeout=15)
            except subprocess.TimeoutExpired:
                w.kill()
        sim.stop()

    ok = code == 0
    # Only lines taken while arrivals ran and every process was up: the stop drains and exits.
    base = [h for h in history if args.settle <= h[0] <= args.minutes and all(v[0] > 0 for v in h[1].values())]
    if len(base) >= 2:
        (t_a, a), (t_b, b) = base[0], base[-1]
        half = len(base) // 2
        for name in names:
            growth = (b[name][0] - a[name][0]) / a[name][0]
            # A worker holds one connection per session in flight, so its count moves with the
            # load by a few: a leak is a second half that never comes down to the first's levels.
            fds_early_max = max(s[name][1] for _, s in base[:half])
            fds_late_min = min(s[name][1] for _, s in base[half:])
            fds_all = [s[name][1] for _, s in base]
            held = growth < RSS_GROWTH_LIMIT and fds_late_min <= fds_early_max
            # The sim is the target, not the generator: shown, not judged.
            word = ("ok" if held else "FAIL") if name != "sim" else "not judged"
            if name != "sim":
                ok &= held
            print(
                f"{name}: RSS {a[name][0]:.1f} MiB at {t_a:.1f} min -> {b[name][0]:.1f} MiB at {t_b:.1f} min "
                f"({growth:+.1%}, limit +{RSS_GROWTH_LIMIT:.0%}); fds {min(fds_all)}..{max(fds_all)}, "
                f"first half up to {fds_early_max}, second half from {fds_late_min}: {word}"
            )
    else:
        print(f"too short for an RSS verdict: fewer than two samples after minute {args.settle:g}")
    recorded, served, lost, twice, extra = compare_with_truth(results / RUN_ID, truth_log)
    info = orjson.loads((results / RUN_ID / "run.json").read_bytes())
    ok &= lost == 0 and twice == 0 and extra == 0 and info.get("requests_recorded") == recorded
    print(
        f"records: {recorded} written (run.json says {info.get('requests_recorded')}), {served} served by the sim; "
        f"lost {lost}, duplicated {twice}, unknown to the sim {extra}; status {info.get('status')}, "
        f"lost workers {len(info.get('lost_workers', []))}"
    )
    print(f"soak {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
