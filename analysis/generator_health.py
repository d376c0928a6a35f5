"""Was the generator able to keep its schedule and its token timing, and if not, why?

The summary's ``generator`` section is decided here from what the workers measured about
themselves (``loadgen/engine/health.py``, merged into run.json's ``generator``) and from the records
(docs/performance.md, "Saturation causes"). Pure functions of dicts and records: no processes.

**Bounds.** Each lag signal's p99 is held against the bound of what it can distort:

* schedule lag shifts arrivals: it matters against the gap between them. Its default bound is
  ``ARRIVAL_GAP_FRACTION`` of the run's mean scheduled gap between requests, never under the
  floor (the ``--max-schedule-lag`` default, 10 ms: timer noise on a shared machine) and never
  over ``BOUND_CEILING_MS``.
* event-loop lag and receive delay delay the reading of chunks: a chunk read late keeps its kernel
  stamp, so they cost ITL accuracy only once a stream's next chunk arrives before the last was read.
  Their default bound is the run's ITL p50, never under the floor (a run whose chunks already
  coalesce has an ITL p50 near 0); without token gaps (no streamed tokens), the schedule bound.

A fourth signal under the rule: token chunks that shared a ``recv`` with the stream's previous one
(one kernel stamp for two tokens) above ``COALESCED_BOUND``, when the generator was measured busy
(below) and its event-loop lag p99 was over the ITL p50 (it read later than the next token came).

An explicit ``--max-schedule-lag`` replaces the rule: the schedule lag and the event-loop lag are
held against it, the receive delay against it or the ITL p50 when that is longer, as before the
rule, and coalesced chunks are a note only. A run.json that does not say whether the bound was
explicit (``max_schedule_lag_explicit``) is read that way too.

**Causes.** When a signal is over its bound the run is saturated (exit 4); the cause is named from
the measured figures, in this order:

* ``own_cpu``: the worker's own CPU at ``OWN_CPU_CAPACITY`` of a core or more, over the run or in
  its busiest interval, or running at least ``OWN_WHILE_LATE`` of the time its loop was late (its
  own code held the loop, even where others took part of the CPU from it).
* ``machine``: not that, but the machine's CPU was taken by others: CPU pressure (``some``, its
  share of the run) at ``PRESSURE_BUSY`` or more, steal at ``STEAL_BUSY``, ``SWITCHES_BUSY_PER_S``
  involuntary context switches a second, or the worker running no more than
  ``DESCHEDULED_WHILE_LATE`` of the time its loop was late (it was not on a CPU when it should have
  been).
* ``coalesced``: coalesced chunks above ``COALESCED_BOUND``, named with the cause above, or alone
  when neither was measured.
* ``undetermined``: none of these measured (the figures are given).

Coalesced chunks above their bound always add a note (the ITL distribution is a lower bound),
saturated or not: where the generator was not measured busy, the server or a proxy may have written
them together, which the client cannot tell from its own late reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ADD_WORKERS",
    "ARRIVAL_GAP_FRACTION",
    "BOUND_CEILING_MS",
    "COALESCED_BOUND",
    "DEFAULT_FLOOR_MS",
    "DESCHEDULED_WHILE_LATE",
    "OWN_CPU_CAPACITY",
    "OWN_WHILE_LATE",
    "PRESSURE_BUSY",
    "STEAL_BUSY",
    "SWITCHES_BUSY_PER_S",
    "Bounds",
    "bounds",
    "coalesced_signal",
    "coalescing",
    "coalescing_from_histograms",
    "decide_cause",
    "generator_notes",
    "mean_arrival_gap_ms",
    "signals_text",
]

DEFAULT_FLOOR_MS = 10.0
ARRIVAL_GAP_FRACTION = 0.10
BOUND_CEILING_MS = 100.0
OWN_CPU_CAPACITY = 0.85
OWN_WHILE_LATE = 0.5
PRESSURE_BUSY = 0.10
SWITCHES_BUSY_PER_S = 100.0
DESCHEDULED_WHILE_LATE = 0.25
STEAL_BUSY = 0.05
COALESCED_BOUND = 0.05

ADD_WORKERS = "add workers (--workers N) or lower the rate"
FREE_MACHINE = "free the machine or run the generator elsewhere"


@dataclass(frozen=True)
class Bounds:
    schedule_ms: float  # schedule lag
    loop_ms: float  # event-loop lag
    recv_ms: float  # receive delay
    source: str  # "explicit" (--max-schedule-lag or the caller), "rule", or "run.json" (before the rule)
    floor_ms: float
    arrival_gap_mean_ms: float | None = None
    itl_p50_ms: float | None = None

    def from_itl(self, limit: float) -> bool:
        """Whether ``limit`` (a reading signal's bound) is the run's ITL p50, over the floor."""
        return self.itl_p50_ms is not None and limit == self.itl_p50_ms and limit > self.floor_ms

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "floor_ms": self.floor_ms,
            "arrival_gap_mean_ms": self.arrival_gap_mean_ms,
            "arrival_gap_fraction": ARRIVAL_GAP_FRACTION if self.source == "rule" else None,
            "ceiling_ms": BOUND_CEILING_MS if self.source == "rule" else None,
            "itl_p50_ms": self.itl_p50_ms,
        }


def bounds(
    *,
    explicit_ms: float | None,
    run_bound_ms: float | None,
    run_explicit: bool | None,
    arrival_gap_mean_ms: float | None,
    itl_p50_ms: float | None,
) -> Bounds:
    """The three signals' bounds (see the module docstring).

    ``explicit_ms``: the caller's bound (``summarize(saturation_lag_ms=...)``), which wins;
    ``run_bound_ms``/``run_explicit``: run.json's ``max_schedule_lag_us`` (in ms) and
    ``max_schedule_lag_explicit`` (None where run.json does not say).
    """
    itl = itl_p50_ms or 0.0
    if explicit_ms is not None or run_explicit is None or run_explicit:
        b = explicit_ms if explicit_ms is not None else (run_bound_ms or DEFAULT_FLOOR_MS)
        source = "explicit" if explicit_ms is not None or run_explicit else "run.json"
        return Bounds(b, b, max(b, itl), source, b, arrival_gap_mean_ms, itl_p50_ms)
    floor = run_bound_ms or DEFAULT_FLOOR_MS
    schedule = floor
    if arrival_gap_mean_ms:
        schedule = max(floor, min(ARRIVAL_GAP_FRACTION * arrival_gap_mean_ms, BOUND_CEILING_MS))
    token = max(floor, itl) if itl_p50_ms is not None else _r(schedule, 1)
    return Bounds(_r(schedule, 1), token, token, "rule", floor, arrival_gap_mean_ms, itl_p50_ms)


def mean_arrival_gap_ms(t_sched_us: Sequence[int]) -> float | None:
    """The mean gap between the scheduled starts of the run's requests (None under two)."""
    if len(t_sched_us) < 2:
        return None
    return _r((max(t_sched_us) - min(t_sched_us)) / (len(t_sched_us) - 1) / 1000.0)


def coalescing(run_figures: dict[str, Any] | None, records: Sequence[Any] | None) -> dict[str, Any]:
    """Token chunks that shared a ``recv`` (and its one kernel stamp) with the stream's previous one.

    The workers' own count when run.json has it; else the records' zero ITL gaps (each such chunk
    is a gap of 0 µs), over the records given (the run's measured requests).
    """
    fig = run_figures or {}
    if fig.get("token_chunks"):
        n, c, source = int(fig["token_chunks"]), int(fig.get("coalesced") or 0), "workers"
    else:
        n = sum(r.chunks for r in records or ())
        c = sum(r.itl_us.count(0) for r in records or ())
        source = "records"
    return {
        "coalesced_share": _r(c / n, 6) if n else None,
        "coalesced_chunks": c,
        "token_chunks": n,
        "coalesced_source": source if n else None,
        "coalesced_bound": COALESCED_BOUND,
    }


def coalescing_from_histograms(histograms: dict[str, Any]) -> tuple[int, int]:
    """(coalesced chunks, token chunks) from live histograms keyed by tag (``metric:...``): ITL
    gaps of 0 µs, clamped to the histogram's 1 µs, over the chunks counted by ``tokens_per_chunk``."""
    coalesced = chunks = 0
    for tag, h in histograms.items():
        metric = tag.partition(":")[0]
        if metric == "itl":
            coalesced += h.get_count_at_value(1)
        elif metric == "tokens_per_chunk":
            chunks += h.get_total_count()
    return coalesced, chunks


def _own(gen: dict[str, Any]) -> tuple[float | None, str, bool]:
    """The own-CPU figure that matters most, where it was measured, and whether it is at capacity:
    ``OWN_CPU_CAPACITY`` over the run or in its busiest interval, or ``OWN_WHILE_LATE`` of the time
    its loop was late (its own code held the loop, even if others took part of the CPU from it)."""
    cpu = gen.get("cpu") or {}
    run = gen.get("max_cpu_share") if gen.get("max_cpu_share") is not None else cpu.get("cpu_share")
    for value, where, limit in (
        (cpu.get("while_late_share"), "while its event loop was late", OWN_WHILE_LATE),
        (cpu.get("worst_interval_share"), f"in its busiest {cpu.get('interval_s') or 1:g} s", OWN_CPU_CAPACITY),
        (run, "over the run", OWN_CPU_CAPACITY),
    ):
        if value is not None and value >= limit:
            return value, where, True
    return run, "over the run", False


def _machine(gen: dict[str, Any]) -> tuple[bool, str | None]:
    """Whether the machine's CPU was measured busy, and its figures in words (None: none measured).

    The pressure that counts is its share of the run (``total``): ``avg10``'s highest value is
    given, but it carries the start-up of the run's own processes (several Python processes
    importing at once) and is not held against the bound."""
    cpu = gen.get("cpu") or {}
    share, avg10 = cpu.get("pressure_some_share"), cpu.get("pressure_some_avg10_max")
    switches, steal = cpu.get("involuntary_switches_per_s"), cpu.get("steal_share")
    late = cpu.get("while_late_share")
    busy = (
        (share is not None and share >= PRESSURE_BUSY)
        or (switches is not None and switches >= SWITCHES_BUSY_PER_S)
        or (steal is not None and steal >= STEAL_BUSY)
        or (late is not None and late <= DESCHEDULED_WHILE_LATE)
    )
    words = []
    if share is not None:
        words.append(
            f"CPU pressure some {_pct(share)} of the run"
            + (f" (avg10 up to {avg10:g}%)" if avg10 is not None else "")
        )
    if switches is not None:
        words.append(f"{switches:g} involuntary switches/s")
    if steal is not None:
        words.append(f"steal {_pct(steal)}")
    if late is not None and late <= DESCHEDULED_WHILE_LATE:
        words.append(f"it ran {_pct(late)} of the time its event loop was late")
    return busy, (", ".join(words) if words else None)


def coalesced_signal(gen: dict[str, Any], itl_p50_ms: float | None) -> str | None:
    """The coalesced-reads signal, when it is the generator's doing (the default rule's fourth
    signal): over ``COALESCED_BOUND``, the generator measured busy (its own CPU at capacity, or the
    machine), and its loop late by more than the typical token gap (when measured). Otherwise the
    chunks may have come that way (the server or a proxy writing several at once): a note only."""
    share = gen.get("coalesced_share")
    if share is None or share <= COALESCED_BOUND:
        return None
    _, _, own_full = _own(gen)
    busy, _ = _machine(gen)
    if not (busy or own_full):
        return None
    loop_p99 = (gen.get("loop_lag_ms") or {}).get("p99")
    if loop_p99 is not None and itl_p50_ms is not None and loop_p99 <= itl_p50_ms:
        return None
    return f"coalesced reads {_pct(share)} of token chunks (over {_pct(COALESCED_BOUND)})"


def decide_cause(gen: dict[str, Any], saturated: bool) -> dict[str, Any]:
    """``cause``, ``causes`` and ``cause_detail`` (the words after the signals, advice included).

    ``gen`` holds run.json's figures (``max_cpu_share``, ``cpu``) and the coalescing figures
    (``coalescing``). Not saturated: no cause, but the measured own share and machine state stay.
    """
    own, where, own_full = _own(gen)
    busy, machine_words = _machine(gen)
    share = gen.get("coalesced_share")
    coalesced = share is not None and share > COALESCED_BOUND
    out: dict[str, Any] = {
        "own_cpu_share": own,
        "machine_busy": busy if machine_words is not None else None,
        "cause": None,
        "causes": [],
        "cause_detail": None,
    }
    if not saturated:
        return out
    causes = ["own_cpu"] if own_full else ["machine"] if busy else []
    if coalesced:
        causes.append("coalesced")
    if not causes:
        causes = ["undetermined"]
    parts = []
    if own_full:
        text = f"its own CPU at {_pct(own)} of a core {where}"
        if busy:
            text += f" (the machine was busy too: {machine_words})"
        parts.append(f"{text}; {ADD_WORKERS}")
    elif busy:
        parts.append(
            f"the machine is busy: {machine_words}; loadgen's own CPU was {_pct(own)} of a core: {FREE_MACHINE}"
        )
    if coalesced and not any(x.startswith("coalesced") for x in gen.get("saturated_by") or []):
        parts.append(_coalesced_words(gen))
    if not own_full and not busy:
        if own is None and machine_words is None:
            parts.append(ADD_WORKERS)  # a run from before these were measured
        else:
            measured = (
                f"its own CPU was {_pct(own)} of a core"
                if own is not None
                else "its own CPU was not measured"
            )
            machine = (
                f"the machine was not measured busy ({machine_words})"
                if machine_words is not None
                else "the machine's load was not measured"
            )
            parts.append(f"{measured} and {machine}: {ADD_WORKERS}")
    out.update(cause=causes[0], causes=causes, cause_detail="; ".join(parts))
    return out


def signals_text(gen: dict[str, Any], word: str = ">") -> str:
    """The signals over their bounds in words, each with its bound (``word`` between them) unless
    it names its own (``(over ITL p50 ..)``, the coalesced reads' ``(over 5%)``)."""
    sched = gen.get("saturation_bound_ms")
    bound = {
        "schedule-lag": sched,
        "event-loop-lag": gen.get("loop_lag_bound_ms", sched),
        "receive-delay": gen.get("recv_delay_bound_ms", sched),
    }
    signals = list(gen.get("saturated_by") or []) or [f"schedule-lag p99 {gen.get('schedule_lag_p99_ms')} ms"]
    out = []
    for x in signals:
        limit = bound.get(x.partition(" ")[0])
        out.append(x if "(over" in x or limit is None else f"{x} {word} {limit} ms")
    return ", ".join(out)


def _coalesced_words(gen: dict[str, Any]) -> str:
    return (
        f"{_pct(gen['coalesced_share'])} of token chunks shared a receive with the previous one "
        "(one kernel stamp for two tokens)"
    )


def generator_notes(gen: dict[str, Any]) -> list[str]:
    """The summary's notes about the generator: saturation with its cause, coalesced chunks."""
    notes = []
    if gen.get("saturated"):
        notes.append(
            f"generator saturated: {signals_text(gen, 'over')}; latencies include client-side delay; "
            f"{gen.get('cause_detail') or ADD_WORKERS}"
        )
    share = gen.get("coalesced_share")
    if share is not None and share > COALESCED_BOUND:
        note = f"the ITL distribution is a lower bound: {_coalesced_words(gen)}"
        if gen.get("coalesced_source") == "records":
            note += ", counted from the records' zero ITL gaps"
        if not gen.get("saturated"):
            busy, words = _machine(gen)
            own, where, own_full = _own(gen)
            if busy or own_full:
                note += (
                    "; the generator likely read late ("
                    + (words if busy else f"its own CPU at {_pct(own)} of a core {where}")
                    + ")"
                )
            elif words is not None:
                note += "; the generator was not measured busy: the server or a proxy may write several chunks at once"
        notes.append(note)
    return notes


def _pct(x: float | None) -> str:
    if x is None:
        return "?"
    v = x * 100.0
    return f"{v:.0f}%" if v >= 10 else f"{v:.1f}%"


def _r(x: float, nd: int = 3) -> float:
    return round(float(x), nd)
