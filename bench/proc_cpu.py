"""A process's CPU time, to the nanosecond, read from outside it.

``psutil``'s ``cpu_times`` reads ``/proc/<pid>/stat``, whose user and system times are in clock
ticks (10 ms with ``USER_HZ`` at 100): a master that uses 6 ms of CPU a second shows 0, 10 or
20 ms in any one second, and over a benchmark's 8 s window a worker's figure moves in steps of
~4%. The process's CPU clock (``clock_getcpuclockid`` and ``clock_gettime``) counts what the
scheduler counted, every thread included, those that have ended too.
"""

from __future__ import annotations

import ctypes
import ctypes.util

import psutil


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


try:
    _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    _getcpuclockid = _libc.clock_getcpuclockid
    _gettime = _libc.clock_gettime
except (OSError, AttributeError):
    _getcpuclockid = _gettime = None


def process_cpu_s(p: psutil.Process) -> float:
    """CPU seconds (user + system) ``p`` has used: from its CPU clock where the system has one,
    else from ``psutil`` (clock ticks). Raises ``psutil.NoSuchProcess`` once it is gone."""
    if _getcpuclockid is not None:
        clock = ctypes.c_int()
        ts = _Timespec()
        if _getcpuclockid(p.pid, ctypes.byref(clock)) == 0 and _gettime(clock, ctypes.byref(ts)) == 0:
            return ts.tv_sec + ts.tv_nsec / 1e9
        if not p.is_running():
            raise psutil.NoSuchProcess(p.pid)
    t = p.cpu_times()
    return t.user + t.system
