"""The master yields the CPU to the workers it shares cores with.

Workers time tokens; the master merges their reports, writes the records and serves the UI, none
of which is timed. On a machine where the two share a core (a laptop, a 2-core CI runner, a pinned
benchmark) the master's bursts (a report merge, a collection, the records written) kept a worker
off its core for a token's interval now and then, and a chunk that waits past the next one comes
out of the same read with it: both get one stamp and their gap is lost. At 500 streams with tokens
10 ms apart, 1.1-1.6% of the chunks were coalesced that way and the ITL error p99 was a whole
interval (10 ms); with the master at nice +5, 0.4% and 0.01-0.02 ms (bench/generator_capacity.py,
docs/performance.md). Nice +5 still gives the master a quarter of a core that a worker saturates,
several times what it needs, so reports are not held back; a machine with spare cores sees no
difference at all.

Only the master's own thread is lowered, after its workers were forked (they keep their
priority), at the start of load; a later run in the same process (the web UI) leaves it there.
"""

from __future__ import annotations

import os

MASTER_NICE = 5
_START_NICE = os.nice(0)  # this process's niceness as it started: a second run (the web UI) adds nothing


def yield_to_workers(increment: int = MASTER_NICE) -> int | None:
    """This process's niceness at ``increment`` over what it started with (once: again is a no-op);
    its niceness now, or None where the system refused (the run goes on as it is)."""
    try:
        target = min(_START_NICE + increment, 19)
        if os.nice(0) < target:
            os.setpriority(os.PRIO_PROCESS, 0, target)
        return os.nice(0)
    except OSError:
        return None


__all__ = ["MASTER_NICE", "yield_to_workers"]
