"""The live one-line progress display of a run (master or local process, on stderr).

On a terminal it rewrites one line every report interval; otherwise (CI logs) it prints a line
every 10 s. Percentiles are computed once per tick from the merged histograms, never per request.

``coalesced``: the share of token chunks that came out of the same ``recv`` as the stream's previous
one (one kernel stamp for two tokens; analysis/generator_health.py). From ``coalescing()`` when
given (the workers' own live counts: (coalesced, token chunks)), else from the finished requests'
histograms (ITL gaps of 0 µs over token chunks). Over its bound the line says the ITL is a lower bound.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from analysis import hdr
from analysis.generator_health import COALESCED_BOUND, coalescing_from_histograms
from analysis.units import format_duration_us


class ProgressLine:
    def __init__(
        self,
        config: Any,
        t0_unix_s: float,
        aggregate: Any,
        in_flight: Callable[[], tuple[int, int, int]],
        stream: Any = None,
        coalescing: Callable[[], tuple[int, int]] | None = None,
    ) -> None:
        self.config = config
        self.t0 = t0_unix_s
        self.aggregate = aggregate
        self.in_flight = in_flight
        self.stream = stream or sys.stderr
        self.coalescing = coalescing
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last_print = 0.0

    def render(self) -> str:
        elapsed = max(0.0, time.time() - self.t0)
        started, sessions, requests_in_flight = self.in_flight()
        ttft = self.aggregate.combined("ttft")
        n = ttft.get_total_count()
        v50, v99 = hdr.percentile_values(ttft, (50.0, 99.0))
        p50 = format_duration_us(v50) if n else "-"
        p99 = format_duration_us(v99) if n else "-"
        errors = sum(self.aggregate.errors.values())
        return (
            f"[{elapsed:6.1f}s] sessions {started} started, {sessions} in flight | "
            f"requests {self.aggregate.requests} done, {requests_in_flight} on the wire | "
            f"TTFT p50 {p50} p99 {p99} | errors {errors}{self._coalesced()}"
        )

    def _coalesced(self) -> str:
        if self.coalescing is not None:
            coalesced, chunks = self.coalescing()
        else:
            coalesced, chunks = coalescing_from_histograms(getattr(self.aggregate, "cumulative", None) or {})
        if not chunks:
            return ""
        share = coalesced / chunks
        flag = " (ITL a lower bound)" if share > COALESCED_BOUND else ""
        return f" | coalesced {share * 100:.1f}%{flag}"

    def tick(self) -> None:
        now = time.time()
        if self.tty:
            self.stream.write("\r\x1b[2K" + self.render())
            self.stream.flush()
        elif now - self._last_print >= 10.0:
            self._last_print = now
            print(self.render(), file=self.stream, flush=True)

    def finish(self) -> None:
        if self.tty:
            self.stream.write("\r\x1b[2K" + self.render() + "\n")
        else:
            print(self.render(), file=self.stream, flush=True)
        self.stream.flush()
