"""Fault injection: which requests fail, and how, drawn from a seeded generator.

Each request draws once per fault kind, in the order of ``KINDS``; the first kind whose draw falls
under its probability is injected (at most one fault per request). With the same seed and the same
order of requests, the same requests fail the same way.

* ``http_500``  -- 500 with an error body, before any streaming
* ``http_429``  -- 429 with ``Retry-After``, before any streaming
* ``cut``       -- the connection is closed mid-stream, without ``[DONE]``
* ``stall``     -- the stream pauses ``stall_s`` wall seconds mid-stream, then goes on
* ``malformed`` -- one extra chunk that is not JSON is written mid-stream, then the stream goes on

"Mid-stream" is before token ``fault_token_index(n)``: the middle of an ``n``-token reply.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

HTTP_500 = "http_500"
HTTP_429 = "http_429"
CUT = "cut"
STALL = "stall"
MALFORMED = "malformed"
KINDS = (HTTP_500, HTTP_429, CUT, STALL, MALFORMED)
MID_STREAM = frozenset({CUT, STALL, MALFORMED})


@dataclass(frozen=True, slots=True)
class FaultConfig:
    """Probability of each fault per request (0..1) and the stall length in wall seconds."""

    http_500: float = 0.0
    http_429: float = 0.0
    cut: float = 0.0
    stall: float = 0.0
    malformed: float = 0.0
    stall_s: float = 2.0

    def __post_init__(self) -> None:
        for kind in KINDS:
            p = getattr(self, kind)
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"fault probability {kind} must be in [0, 1] (got {p})")
        if self.stall_s < 0:
            raise ValueError(f"stall_s must be >= 0 (got {self.stall_s})")

    @property
    def any(self) -> bool:
        return any(getattr(self, k) > 0 for k in KINDS)


def fault_token_index(n_tokens: int) -> int:
    """Token index a mid-stream fault comes before: the middle of the reply (0 for one token)."""
    return n_tokens // 2


class FaultPicker:
    """Draws the fault (or None) of each request in arrival order."""

    def __init__(self, config: FaultConfig, seed: int) -> None:
        self.config = config
        self._rng = random.Random(f"loadgen-sim-faults-{seed}")
        self._probs = tuple((k, getattr(config, k)) for k in KINDS)
        self._enabled = config.any

    def draw(self) -> str | None:
        if not self._enabled:
            return None
        rnd = self._rng.random
        for kind, p in self._probs:
            if rnd() < p:
                return kind
        return None
