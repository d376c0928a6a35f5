"""The generator's own health: is this worker too busy to time tokens? (docs/performance.md, saturation)

Two signals a worker measures about itself, besides the schedule lag every request records:

* **event-loop lag**: a timer of the loop asks to run ``period_s`` after it was armed and records
  how much later than asked it ran. Every greenlet of the worker (streams, arrivals, reports) waits
  in the same loop, so this is how late any of them gets to run. A free loop wakes within ~0.1 ms.
  The timer's callback runs in the hub, as a sleeping greenlet's wake-up would, without the switch
  into a greenlet and back: 50 times a second on a virtual machine, that switch and gevent's
  sleep cost ~4 ms of CPU a second (docs/performance.md, "Wake-ups"). While the worker has no
  request in flight (``busy``), the timer runs every ``IDLE_PERIOD_S`` instead: nothing waits
  on the loop then but the next arrival, whose lateness its request records as schedule lag,
  and each wake-up of an idle process costs ~60-150 µs of CPU on a virtual machine, which made
  the probe nearly all of an idle run's worker.
* **receive delay**: per ``recv``, the time from the kernel's receive timestamp of the data to the
  moment the client started parsing it (``loadgen.engine.client``). Token times are the kernel's stamps,
  so they stay exact while the worker falls behind, up to a point: once a stream's next chunk
  arrives before the previous one was read, both come out of one ``recv`` with one stamp, and the
  gap between them is lost. A receive delay near a stream's inter-token gap is that point; the
  delay grows long before ITL errors do, which is why it is watched.

Both go into HDR histograms (µs); a worker ships them encoded with its state, cumulative since its
plan started (refreshed every few seconds, and in its final report); the master merges them
exactly into run.json's ``generator`` section (``summarize``), and the summary flags the run
saturated when a p99 is over its bound (``--max-schedule-lag``; for the receive delay, the run's
ITL p50 when that is longer), as for schedule lag (analysis/summary.py; loadgen/runtime/verdict.py: exit 4).

``LOADGEN_TEST_BURN=<busy ms>/<period ms>`` makes the worker burn CPU in a greenlet (busy for the
first number of milliseconds of every period) so that tests can drive it past saturation on
purpose. It is for tests and is named in run.json when set.

What the worker measures besides, so that the summary can name *why* it fell behind
(analysis/generator_health.py decides; docs/performance.md, "Saturation causes"):

* **its own CPU**: process CPU time over wall time, over the run and per ``SAMPLE_S`` interval
  (the busiest one is kept), and over the windows in which the loop woke at least ``LATE_WAKE_NS``
  late: near a full core there, the worker's own code held the loop; near zero, the worker was not
  running at all while it should have been (another process had the CPU).
* **the machine**: Linux CPU pressure (``/proc/pressure/cpu``: ``some avg10``, its highest value seen,
  and the ``total`` microseconds over the run), the worker's involuntary context switches
  (``getrusage``), and steal time (``/proc/stat``). Each read is a small file or a system call,
  once per ``SAMPLE_S``; each is left out where the system does not have it (no PSI in the
  container, not Linux).
* **coalesced token chunks**: the streaming client counts token-bearing chunks, and those that came
  out of the same ``recv`` as the stream's previous token chunk (one kernel stamp for both: the gap
  between them is lost). ``recv_delays_ns`` carries the counter (``ChunkCounts``) to every stream.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gevent
import numpy as np
from hdrh.histogram import HdrHistogram

from analysis import hdr
from analysis.hlog import new_histogram, record_clamped
from loadgen.engine.worker_gc import COLLECTOR, merge_gc

__all__ = [
    "BURN_ENV",
    "ChunkCounts",
    "Counters",
    "GeneratorHealth",
    "RecvDelays",
    "coalescing_counts",
    "read_counters",
    "summarize",
]

BURN_ENV = "LOADGEN_TEST_BURN"
# Receive delays are folded into their histogram in slices of this many (each fold well under 1 ms),
# and the encoded state is refreshed at most this often in periodic reports.
FOLD_VALUES = 4096
SHIP_INTERVAL_S = 5.0
# The CPU counters are read this often (the busiest interval's own CPU share is kept), and a wake of
# the loop this late counts its window in the own-CPU-while-late figure.
SAMPLE_S = 1.0
# The loop-lag probe's period while no request is in flight (``GeneratorHealth.busy``).
IDLE_PERIOD_S = 0.25
LATE_WAKE_NS = 2_000_000
# A worker's own-CPU-while-late share is only given over at least this much late time.
MIN_LATE_S = 0.1
PSI_PATH = "/proc/pressure/cpu"
STAT_PATH = "/proc/stat"
_perf_ns = time.perf_counter_ns
_cpu_ns = time.process_time_ns


class ChunkCounts:
    """Token-bearing chunks a worker's streams received, and how many of them came out of the same
    ``recv`` as the stream's previous token chunk (``loadgen.engine.sse_state.StreamState.take``)."""

    __slots__ = ("coalesced", "token_chunks")

    def __init__(self) -> None:
        self.token_chunks = 0
        self.coalesced = 0


class RecvDelays(list):
    """The list streams append their receive delays to, carrying the worker's ``ChunkCounts``
    (``chunks``): one object handed to every connection, as the receive delays always were.

    The compiled reader's raw path appends its delays to ``raw`` instead, as native int64 ns, so
    that a read builds no Python object (``loadgen/engine/_chat.c``)."""

    __slots__ = ("chunks", "raw")

    def __init__(self) -> None:
        super().__init__()
        self.chunks = ChunkCounts()
        self.raw = bytearray()

    def pending(self) -> int:
        """Delays held, in the list and in ``raw``."""
        return len(self) + len(self.raw) // 8

    def take(self) -> np.ndarray:
        """Every delay held, as int64 ns, and forget them (in place: every stream holds this
        very object)."""
        listed = np.asarray(self, dtype=np.int64)
        raw = np.frombuffer(self.raw, dtype=np.int64).copy()  # a copy: raw is resized after
        self.clear()
        self.raw.clear()
        return np.concatenate((listed, raw)) if raw.size else listed


@dataclass(frozen=True)
class Counters:
    """One reading of the cumulative counters (None: not available here)."""

    t_ns: int  # perf_counter
    cpu_ns: int  # this process's CPU time
    nivcsw: int | None  # involuntary context switches of this process
    psi_some_us: int | None  # /proc/pressure/cpu "some" total
    psi_some_avg10: float | None  # its avg10, in percent
    steal: int | None  # /proc/stat cpu line: steal ticks
    ticks: int | None  # /proc/stat cpu line: all ticks (user .. steal)


def parse_psi(text: str) -> tuple[float, int] | None:
    """``some avg10`` (percent) and ``some total`` (µs) from /proc/pressure/cpu's text."""
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        if kind != "some":
            continue
        fields = dict(f.split("=", 1) for f in rest.split() if "=" in f)
        try:
            return float(fields["avg10"]), int(fields["total"])
        except (KeyError, ValueError):
            return None
    return None


def parse_stat(text: str) -> tuple[int, int] | None:
    """Steal ticks and all ticks (user, nice, system, idle, iowait, irq, softirq, steal) from the
    ``cpu`` line of /proc/stat (guest time is already in user)."""
    for line in text.splitlines():
        if line.startswith("cpu "):
            try:
                v = [int(x) for x in line.split()[1:9]]
            except ValueError:
                return None
            return (v[7], sum(v)) if len(v) == 8 else None
    return None


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except (OSError, ValueError):  # absent, or PSI compiled in but off (EOPNOTSUPP)
        return None


def read_counters() -> Counters:
    """The counters now; each one that this system does not have is None."""
    try:
        nivcsw: int | None = resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw
    except (OSError, AttributeError):
        nivcsw = None
    psi_text = _read(PSI_PATH)
    psi = parse_psi(psi_text) if psi_text else None
    stat_text = _read(STAT_PATH)
    stat = parse_stat(stat_text) if stat_text else None
    return Counters(
        t_ns=_perf_ns(),
        cpu_ns=_cpu_ns(),
        nivcsw=nivcsw,
        psi_some_us=psi[1] if psi else None,
        psi_some_avg10=psi[0] if psi else None,
        steal=stat[0] if stat else None,
        ticks=stat[1] if stat else None,
    )


def cpu_figures(
    first: Counters,
    last: Counters,
    *,
    worst_interval_share: float | None = None,
    avg10_max: float | None = None,
    late_wakes: int = 0,
    late_ns: int = 0,
    late_cpu_ns: int = 0,
) -> dict[str, Any]:
    """What a worker ships about its CPU and the machine's, from its first and latest readings."""
    wall_ns = last.t_ns - first.t_ns

    def delta(name: str) -> int | None:
        a, b = getattr(first, name), getattr(last, name)
        return None if a is None or b is None else max(0, b - a)

    psi_us, steal, ticks = delta("psi_some_us"), delta("steal"), delta("ticks")
    avg10 = [v for v in (avg10_max, first.psi_some_avg10, last.psi_some_avg10) if v is not None]
    return {
        "wall_s": round(wall_ns / 1e9, 4),
        "cpu_s": round(max(0, last.cpu_ns - first.cpu_ns) / 1e9, 4),
        "worst_interval_share": None if worst_interval_share is None else round(worst_interval_share, 4),
        "interval_s": SAMPLE_S,
        "late_wakes": late_wakes,
        "late_s": round(late_ns / 1e9, 4),
        "late_cpu_s": round(late_cpu_ns / 1e9, 4),
        "involuntary_switches": delta("nivcsw"),
        "pressure_some_s": None if psi_us is None else round(psi_us / 1e6, 4),
        "pressure_some_avg10_max": max(avg10) if avg10 else None,
        "steal_share": round(steal / ticks, 4) if steal is not None and ticks else None,
    }


class GeneratorHealth:
    """One worker's event-loop lag and receive delays since ``start``.

    ``recv_delays_ns`` is the list the streaming client appends to (one value per ``recv`` that
    carried stream lines); ``state()`` folds it into the histogram and returns both, encoded.
    """

    def __init__(self, period_s: float = 0.02, idle_period_s: float = IDLE_PERIOD_S) -> None:
        self.period_s = period_s
        self.idle_period_s = idle_period_s
        # Whether the worker has a request in flight (set by its runtime once its driver is
        # made): the probe runs every ``period_s`` then, every ``idle_period_s`` otherwise.
        self.busy: Callable[[], bool] | None = None
        self.loop_lag = new_histogram()
        self.recv_delay = new_histogram()
        self.recv_delays_ns = RecvDelays()
        self.chunks = self.recv_delays_ns.chunks
        self._first = self._last = read_counters()
        self._worst_share: float | None = None
        self._avg10_max: float | None = self._first.psi_some_avg10
        self.late_wakes = 0
        self.late_ns = 0
        self.late_cpu_ns = 0
        self.burn = os.environ.get(BURN_ENV) or None
        self._greenlets: list[gevent.Greenlet] = []
        self._shipped: dict[str, Any] | None = None
        self._shipped_at = 0.0
        self._loop: Any = None  # gevent's loop, while the watch runs (``start``)
        self._tick: Any = None  # its timer for the next tick
        self._armed_period_ns = int(period_s * 1e9)
        self._armed_ns = self._armed_cpu_ns = self._next_sample_ns = 0
        self._lags_us: list[int] = []  # loop lags not yet in ``loop_lag``

    def start(self) -> None:
        COLLECTOR.start()  # collections by the clock while this worker runs (loadgen.engine.worker_gc)
        self._loop = gevent.get_hub().loop
        self._next_sample_ns = _perf_ns() + int(SAMPLE_S * 1e9)
        self._arm()
        if self.burn:
            busy_ms, _, period_ms = self.burn.partition("/")
            self._greenlets.append(gevent.spawn(_burn, float(busy_ms) / 1e3, float(period_ms or busy_ms) / 1e3))

    def stop(self) -> None:
        self._loop = None  # a tick running now arms no other
        if self._tick is not None:
            self._tick.stop()
            self._tick = None
        gevent.killall(self._greenlets, block=False)
        self._greenlets = []
        COLLECTOR.stop()

    def _arm(self) -> None:
        period_s = self.period_s if self.busy is None or self.busy() else self.idle_period_s
        self._armed_period_ns = int(period_s * 1e9)
        self._armed_ns = _perf_ns()
        self._armed_cpu_ns = _cpu_ns()
        if self._loop is not None:
            # A new one-shot timer per tick, as gevent's own sleep makes: libev's started again
            # from its own callback ran at once, over and over.
            self._tick = self._loop.timer(period_s)
            self._tick.start(self._on_tick)

    def _on_tick(self) -> None:
        """The timer ran (in the hub): its lag, and every ``SAMPLE_S`` the CPU counters."""
        try:
            now = _perf_ns()
            lag = now - self._armed_ns - self._armed_period_ns
            self._lags_us.append(max(1, lag // 1000))
            if lag >= LATE_WAKE_NS:
                # How much of this late window the worker itself was running: its own work held
                # the loop (near a full core), or it was not running at all (others had the CPU).
                self.late_wakes += 1
                self.late_ns += now - self._armed_ns
                self.late_cpu_ns += _cpu_ns() - self._armed_cpu_ns
            if now >= self._next_sample_ns:
                self._next_sample_ns = now + int(SAMPLE_S * 1e9)
                self._sample()
                self._fold_lags()
            COLLECTOR.if_late()
            if self.recv_delays_ns.pending() >= FOLD_VALUES:
                self._fold()
        finally:  # armed again whatever happened: a watch that stops would say nothing, falsely
            self._arm()

    def _fold_lags(self) -> None:
        if self._lags_us:
            record_clamped(self.loop_lag, self._lags_us)
            self._lags_us = []

    def _sample(self) -> Counters:
        c = read_counters()
        prev, self._last = self._last, c
        wall = c.t_ns - prev.t_ns
        if wall >= SAMPLE_S * 0.5e9:
            share = (c.cpu_ns - prev.cpu_ns) / wall
            if self._worst_share is None or share > self._worst_share:
                self._worst_share = share
        if c.psi_some_avg10 is not None and (self._avg10_max is None or c.psi_some_avg10 > self._avg10_max):
            self._avg10_max = c.psi_some_avg10
        return c

    def cpu_state(self) -> dict[str, Any]:
        """Own CPU and the machine's counters since ``__init__`` (``cpu_figures``), read now."""
        last = self._sample()
        return cpu_figures(
            self._first, last, worst_interval_share=self._worst_share, avg10_max=self._avg10_max,
            late_wakes=self.late_wakes, late_ns=self.late_ns, late_cpu_ns=self.late_cpu_ns,
        )  # fmt: skip

    def _fold(self) -> None:
        pending = self.recv_delays_ns.take()
        if pending.size:
            record_clamped(self.recv_delay, pending // 1000)

    def state(self, max_age_s: float = SHIP_INTERVAL_S) -> dict[str, Any]:
        """Both histograms so far, encoded (what a worker ships with its state).

        Encoding compresses the whole counts array: several ms for a wide histogram, a pause of
        the event loop that would show in the very lag it measures. So a state younger than
        ``max_age_s`` is shipped again as it was; a final report asks for ``max_age_s=0``.
        """
        now = time.monotonic()
        if self._shipped is not None and now - self._shipped_at < max_age_s:
            return self._shipped
        self._fold()
        self._fold_lags()
        out: dict[str, Any] = {
            "loop_lag": self.loop_lag.encode(),
            "recv_delay": self.recv_delay.encode(),
            "cpu": self.cpu_state(),
            "chunks": {"token_chunks": self.chunks.token_chunks, "coalesced": self.chunks.coalesced},
            "gc": COLLECTOR.figures(),
        }
        if self.burn:
            out["test_burn"] = self.burn
        self._shipped, self._shipped_at = out, now
        return out


def _burn(busy_s: float, period_s: float) -> None:
    """Hold the loop busy for ``busy_s`` of every ``period_s`` (the test hook)."""
    while True:
        end = time.perf_counter() + busy_s
        while time.perf_counter() < end:
            pass
        gevent.sleep(max(0.0, period_s - busy_s))


def summarize(states: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """run.json's health figures: the workers' histograms merged exactly, as p50/p99/max in ms;
    their CPU and machine figures (``cpu``: the worst worker's, each by worker under
    ``by_worker``); their token chunks and coalesced chunks, summed (``coalescing``)."""
    merged: dict[str, HdrHistogram] = {"loop_lag": new_histogram(), "recv_delay": new_histogram()}
    burn = None
    by_worker: dict[str, dict[str, Any]] = {}
    token_chunks = coalesced = 0
    counted = False
    gc_figures: list[dict[str, Any]] = []
    for wid, st in states.items():
        health = st.get("health") or {}
        for name, h in merged.items():
            if health.get(name):
                h.decode_and_add(health[name])
        burn = burn or health.get("test_burn")
        if health.get("cpu"):
            by_worker[wid] = worker_cpu(health["cpu"])
        if health.get("gc"):
            gc_figures.append(health["gc"])
        chunks = health.get("chunks")
        if chunks:
            counted = True
            token_chunks += int(chunks.get("token_chunks") or 0)
            coalesced += int(chunks.get("coalesced") or 0)
    out: dict[str, Any] = {f"{name}_ms": _figures(h) for name, h in merged.items()}
    if by_worker:
        out["cpu"] = {**merge_cpu(list(by_worker.values())), "by_worker": by_worker}
    if counted:
        out["coalescing"] = {
            "token_chunks": token_chunks,
            "coalesced": coalesced,
            "share": round(coalesced / token_chunks, 6) if token_chunks else None,
        }
    if gc_figures:
        out["gc"] = merge_gc(gc_figures)
    if burn:
        out["test_burn"] = burn
    return out


def coalescing_counts(states: dict[str, dict[str, Any]]) -> tuple[int, int]:
    """(coalesced, token chunks) summed over the workers' latest states: the progress line's live
    figure (``loadgen.live.progress.ProgressLine(coalescing=...)``)."""
    coalesced = chunks = 0
    for st in states.values():
        c = (st.get("health") or {}).get("chunks") or {}
        coalesced += int(c.get("coalesced") or 0)
        chunks += int(c.get("token_chunks") or 0)
    return coalesced, chunks


def worker_cpu(fig: dict[str, Any]) -> dict[str, Any]:
    """One worker's shipped CPU figures as shares and rates (None where not measured)."""
    wall = fig.get("wall_s") or 0.0
    late = fig.get("late_s") or 0.0
    ivcsw, psi = fig.get("involuntary_switches"), fig.get("pressure_some_s")
    return {
        "wall_s": fig.get("wall_s"),
        "cpu_share": round(fig["cpu_s"] / wall, 4) if wall and fig.get("cpu_s") is not None else None,
        "worst_interval_share": fig.get("worst_interval_share"),
        "late_wakes": fig.get("late_wakes") or 0,
        "late_s": fig.get("late_s"),
        "while_late_share": round(fig.get("late_cpu_s", 0.0) / late, 4) if late >= MIN_LATE_S else None,
        "involuntary_switches_per_s": round(ivcsw / wall, 2) if wall and ivcsw is not None else None,
        "pressure_some_share": round(psi / wall, 4) if wall and psi is not None else None,
        "pressure_some_avg10_max": fig.get("pressure_some_avg10_max"),
        "steal_share": fig.get("steal_share"),
    }


def merge_cpu(workers: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's figures: each the highest over workers (the worker that fell behind is the one
    that matters); late wakes summed."""

    def top(key: str) -> float | None:
        vals = [w[key] for w in workers if w.get(key) is not None]
        return max(vals) if vals else None

    keys = ("cpu_share", "worst_interval_share", "while_late_share", "involuntary_switches_per_s",
            "pressure_some_share", "pressure_some_avg10_max", "steal_share")  # fmt: skip
    return {
        **{k: top(k) for k in keys},
        "interval_s": SAMPLE_S,
        "late_wakes": sum(w.get("late_wakes") or 0 for w in workers),
    }


def _figures(h: HdrHistogram) -> dict[str, Any] | None:
    n = h.get_total_count()
    if not n:
        return None
    p50, p99 = hdr.percentile_values(h, (50.0, 99.0))
    return {
        "count": n,
        "p50": round(p50 / 1000.0, 3),
        "p99": round(p99 / 1000.0, 3),
        "max": round(h.get_max_value() / 1000.0, 3),
    }
