"""Where a worker's event loop stalls: every greenlet's run between two switches, longer than
``LOADGEN_STALL_MS`` (default 2), with its wall time, its thread CPU and where it switched out.

Put this directory on ``PYTHONPATH`` and name an output directory in ``LOADGEN_STALL_TRACE``; a
Locust worker forked by ``loadgen run`` writes ``stalls-<pid>.txt`` there every 2 s and at exit::

    LOADGEN_STALL_TRACE=/tmp/stalls PYTHONPATH=bench/loop_stalls \\
        .venv/bin/python bench/generator_capacity.py -c 500 --pace 10ms -d 12

A run whose wall time is well over its CPU waited for its core (another process or thread ran); one whose
CPU is near its wall time held the loop itself. The hub's own runs are its waits for events and
are left out of the list. For diagnosis only: the trace costs ~1 µs a switch.
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter

_OUT = os.environ.get("LOADGEN_STALL_TRACE")


def _name(g: object) -> str:
    run = getattr(g, "_run", None) or getattr(g, "run", None)
    return getattr(run, "__qualname__", None) or type(g).__name__


def _install() -> None:
    import greenlet

    threshold_ns = int(float(os.environ.get("LOADGEN_STALL_MS", "2")) * 1e6)
    last = {"wall": time.perf_counter_ns(), "cpu": time.thread_time_ns(), "written": 0}
    stalls: list[tuple[int, int, str, str]] = []
    path = os.path.join(_OUT or ".", f"stalls-{os.getpid()}.txt")

    def write() -> None:
        own = [s for s in stalls if s[2] != "Hub.run"]
        by_where = Counter((name, where.split("<")[0]) for _w, _c, name, where in own)
        with open(path, "w") as f:
            f.write(f"runs over {threshold_ns / 1e6:g} ms without a switch (hub's waits left out): {len(own)}\n")
            for (name, where), n in by_where.most_common(30):
                f.write(f"{n:6d}  {name}  at {where}\n")
            f.write("\nlongest: wall ms, thread CPU ms, greenlet, where it switched out\n")
            for wall, cpu, name, where in sorted(own, reverse=True)[:60]:
                f.write(f"{wall / 1e6:8.2f} {cpu / 1e6:8.2f}  {name}  {where}\n")

    def trace(event: str, args: tuple) -> None:
        if event not in ("switch", "throw"):
            return
        origin = args[0]
        now, cpu = time.perf_counter_ns(), time.thread_time_ns()
        wall_ns, cpu_ns = now - last["wall"], cpu - last["cpu"]
        last["wall"], last["cpu"] = now, cpu
        if wall_ns > threshold_ns:
            frame = origin.gr_frame if origin is not greenlet.getcurrent() else sys._getframe(1)
            where = []
            while frame is not None and len(where) < 8:
                where.append(f"{frame.f_code.co_name}:{frame.f_lineno}")
                frame = frame.f_back
            stalls.append((wall_ns, cpu_ns, _name(origin), "<".join(where)))
        if now - last["written"] > 2_000_000_000:
            last["written"] = now
            write()

    greenlet.settrace(trace)
    import atexit

    atexit.register(write)


if _OUT:
    # Locust's --processes forks the workers from the master: trace in the children only.
    os.register_at_fork(after_in_child=_install)
