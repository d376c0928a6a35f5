"""What a nearly idle ``loadgen run`` costs: each process's share of a core while almost nothing
happens (one short session every ``--every`` seconds against the embedded simulated engine).

The fixed costs of a run (heartbeats, reports, health probes, the loops that wait for work) are
paid whatever the load; at light load they are most of what a run costs per token. This measures
them alone: the CPU seconds (user + system, from its CPU clock: ``bench/proc_cpu.py``) each process of the tree used
over a window that starts after start-up, divided by the window's wall time. Each session is one
turn of 16 output tokens, so what is measured is the run's own upkeep, not token traffic;
``--workload`` measures another (a shipped spec's agentic sessions keep streams open for
seconds: the sim and the worker then do real work).

Not a test: figures, for docs/performance.md. Example:

    .venv/bin/python bench/idle_cost.py                # 30 s run, 20 s window
    .venv/bin/python bench/idle_cost.py --duration 60 --every 10
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
from proc_cpu import process_cpu_s

ROLES = ("front", "sim", "master", "worker")

TINY_SPEC = """\
name: bench-idle
description: one short turn - a run's upkeep with next to no traffic
system_prompt_tokens: 0
turns: 1
user_tokens: 16
output_tokens: 16
think_time: 0
"""


def role_of(p: psutil.Process, root_pid: int) -> str:
    if p.pid == root_pid:
        return "front"
    cmd = " ".join(p.cmdline())
    if "targets.sim" in cmd or "targets.fleet" in cmd:
        return "sim"
    if "locust" in cmd:
        parent = p.parent()
        return "worker" if parent is not None and "locust" in " ".join(parent.cmdline()) else "master"
    return "other"


def cpu_by_pid(root: psutil.Process) -> dict[int, tuple[str, float]]:
    out = {}
    for p in [root, *root.children(recursive=True)]:
        try:
            out[p.pid] = (role_of(p, root.pid), process_cpu_s(p))
        except psutil.NoSuchProcess:
            pass
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=30.0, help="the run's length, s")
    ap.add_argument("--every", type=float, default=10.0, help="one session every this many seconds")
    ap.add_argument("--skip", type=float, default=8.0, help="start-up left out of the window, s")
    ap.add_argument("--workload", help="a workload to run instead of one 16-token turn a session")
    args = ap.parse_args()
    window = args.duration - args.skip - args.every - 2.0  # constant arrivals: the last is `every` before the end
    with tempfile.TemporaryDirectory(prefix="loadgen-idle-") as d:
        workload = args.workload
        if workload is None:
            workload = str(Path(d) / "idle.yaml")
            Path(workload).write_text(TINY_SPEC)
        cmd = [
            sys.executable, "-m", "loadgen", "run", "--workload", workload, "--arrival", "constant",
            "--rate", f"{1.0 / args.every:g}",
            "--duration", f"{args.duration:g}s", "--results", str(Path(d) / "results"),
        ]  # fmt: skip
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        root = psutil.Process(proc.pid)
        time.sleep(args.skip)
        a, ta = cpu_by_pid(root), time.monotonic()
        threading.Event().wait(window)
        b, tb = cpu_by_pid(root), time.monotonic()
        proc.wait(timeout=args.duration + 120)
    wall = tb - ta
    if not any(role == "worker" for role, _ in b.values()):
        sys.exit("the run ended before the window did: give it a longer --duration")
    shares = dict.fromkeys((*ROLES, "other"), 0.0)
    for pid, (role, cpu_b) in b.items():  # a process that started or ended in the window: its part in it
        shares[role] += (cpu_b - a.get(pid, (role, 0.0))[1]) / wall
    what = args.workload or "one 16-token turn"
    print(f"loadgen run, {what} every {args.every:g} s, embedded sim; window {wall:.1f} s after {args.skip:g} s")
    for r in (*ROLES, "other"):
        if shares[r] or r in ROLES:
            print(f"  {r:<7} {shares[r]:7.2%} of a core")
    print(f"  {'total':<7} {sum(shares.values()):7.2%} of a core (target: under 1%)")


if __name__ == "__main__":
    main()
