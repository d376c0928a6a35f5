"""A worker's helper threads yield the core to its event loop.

A worker times tokens in one thread: its event loop, where every greenlet runs. Its other threads
help: zmq's I/O thread (the reports to the master, the heartbeats) and its reaper, and gevent's
resolver pool. On a core they share with the loop (a machine with fewer cores than processes; the
benchmark's client core), each report, every 0.5 s, woke zmq's I/O thread, which preempted the
loop at once to push the report through the socket (~90 KB at 1,000 requests a second; over
loopback the master's receive runs in the sender's context too) while a tick's chunks waited; the
master's zmq thread, woken to take the report, did the same. A report's run of the loop took
5.6-6.3 ms of wall time for ~2 ms of its own CPU (median, 1,000 streams with tokens 10 ms apart);
with the helpers as below, 2.3-2.4 ms, its CPU time, and at 500 streams 5-6 runs over 2 ms in a
12 s point where there were 23-25 (``bench/loop_stalls``; docs/performance.md, "The report's
stall").

So the threads a worker has when it starts, all but the loop's, become batch tasks
(``SCHED_BATCH``: their wake-ups do not preempt the loop; they run when it waits, or at the
scheduler's next tick) at nice +5 (a quarter of the core when the loop wants all of it, far more
than they need). Nothing they do is timed; a report or a heartbeat waits a few ms at most. Threads
started later by the loop's thread take its policy, the normal one. On a machine with a spare
core nothing changes. The master does the same with its own zmq threads (which receive the
reports) once load starts, beside its own thread at nice +5 (``master_priority.py``).
``LOADGEN_HELPER_THREADS=normal`` leaves them all as they were (to compare, or to rule this out).
"""

from __future__ import annotations

import os

__all__ = ["HELPER_NICE", "HELPER_THREADS_ENV", "yield_helper_threads"]

HELPER_THREADS_ENV = "LOADGEN_HELPER_THREADS"
HELPER_NICE = 5


def yield_helper_threads(loop_tid: int | None = None) -> int:
    """Every thread of this process but ``loop_tid`` (default: the process's first thread, the
    one a forked worker runs its loop in) as a batch task at nice +``HELPER_NICE``; how many were
    changed (0 where asked not to, or where the system has no such policy or refuses)."""
    if os.environ.get(HELPER_THREADS_ENV, "").strip().lower() == "normal":
        return 0
    policy = getattr(os, "SCHED_BATCH", None)
    if policy is None:
        return 0
    loop_tid = os.getpid() if loop_tid is None else loop_tid
    changed = 0
    for tid in _threads():
        if tid == loop_tid:
            continue
        try:
            os.sched_setscheduler(tid, policy, os.sched_param(0))
            os.setpriority(os.PRIO_PROCESS, tid, max(os.getpriority(os.PRIO_PROCESS, tid), HELPER_NICE))
        except OSError:  # gone since it was listed, or a sandbox that refuses: it stays as it is
            continue
        changed += 1
    return changed


def _threads() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return []
