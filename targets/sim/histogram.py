"""A Prometheus histogram (cumulative ``le`` buckets, ``_sum``, ``_count``) for the sim's latency
metrics, with the bucket bounds vLLM uses for the same names, so a dashboard built on vLLM reads
the sim unchanged."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable

# Bucket upper bounds in seconds (vLLM V1's, vllm/v1/metrics/loggers.py).
TTFT_BUCKETS_S = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS_S = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_BUCKETS_S = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
    960.0, 1920.0, 7680.0,
)  # fmt: skip


def one_two_five_buckets(largest: float) -> tuple[float, ...]:
    """1, 2, 5, 10, 20, 50, ... up to ``largest`` (vLLM's token-count buckets up to max_model_len)."""
    out: list[float] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale > largest:
                return tuple(out)
            out.append(float(m * scale))
        scale *= 10


class Histogram:
    """Counts per bucket (non-cumulative inside; cumulative on the page), the sum and the count."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value_s: float) -> None:
        self.counts[bisect_left(self.bounds, value_s)] += 1  # le: a value on a bound is in that bucket
        self.sum += value_s
        self.count += 1

    def observe_all(self, values_s: Iterable[float]) -> None:
        counts, bounds = self.counts, self.bounds
        n = 0
        total = 0.0
        for v in values_s:
            counts[bisect_left(bounds, v)] += 1
            total += v
            n += 1
        self.sum += total
        self.count += n

    def lines(self, name: str, labels: str) -> list[str]:
        """Sample lines for ``name`` whose other labels are ``labels`` (``k="v",...``)."""
        out = []
        running = 0
        for bound, n in zip((*self.bounds, None), self.counts, strict=True):
            running += n
            le = "+Inf" if bound is None else repr(float(bound))
            out.append(f'{name}_bucket{{{labels},le="{le}"}} {running}')
        out.append(f"{name}_sum{{{labels}}} {self.sum!r}")
        out.append(f"{name}_count{{{labels}}} {self.count}")
        return out
