"""Parsing and formatting of the units users type: durations (``90s``, ``500ms``, ``2m``) and rates
(``2``, ``200/s``, ``30/min``).

This module is the leaf every package may import (``workloads`` for think times, ``loadgen`` for
flags, ``analysis`` for SLOs). Parsers raise ``ValueError`` with the accepted form in the message;
callers add the name of the flag or file key.
"""

from __future__ import annotations

import math
import re

_DURATION_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(us|µs|ms|s|m|min|h)?\s*$")
_DURATION_UNITS_S = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}

_RATE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(?:/\s*(s|sec|m|min|h))?\s*$")
_RATE_PER_S = {None: 1.0, "s": 1.0, "sec": 1.0, "m": 1 / 60, "min": 1 / 60, "h": 1 / 3600}

DURATION_FORM = "a number with a unit: us, ms, s, m or h (e.g. 500ms, 90s, 2m); a bare number is seconds"
RATE_FORM = "a number per second, optionally with a unit (e.g. 2, 200/s, 30/min)"


def parse_duration_s(text: str | float | int) -> float:
    """Seconds in ``text`` (``"500ms"`` -> 0.5). Bare numbers are seconds. Negative is an error."""
    if isinstance(text, bool):
        raise ValueError(f"{text!r} is not a duration; use {DURATION_FORM}")
    if isinstance(text, int | float):
        value = float(text)
    else:
        m = _DURATION_RE.match(str(text))
        if not m:
            raise ValueError(f"{text!r} is not a duration; use {DURATION_FORM}")
        value = float(m.group(1)) * _DURATION_UNITS_S[m.group(2) or "s"]
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{text!r} is not a duration; use {DURATION_FORM}")
    return value


def parse_rate_per_s(text: str | float | int) -> float:
    """Events per second in ``text`` (``"30/min"`` -> 0.5). Must be > 0."""
    if isinstance(text, bool):
        raise ValueError(f"{text!r} is not a rate; use {RATE_FORM}")
    if isinstance(text, int | float):
        value = float(text)
    else:
        m = _RATE_RE.match(str(text))
        if not m:
            raise ValueError(f"{text!r} is not a rate; use {RATE_FORM}")
        value = float(m.group(1)) * _RATE_PER_S[m.group(2)]
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{text!r} is not a rate; use {RATE_FORM} greater than 0")
    return value


def format_duration_us(value_us: float | None) -> str:
    """Human form of a µs value: ``850us``, ``12.3ms``, ``1.25s``; ``-`` for None."""
    if value_us is None or (isinstance(value_us, float) and math.isnan(value_us)):
        return "-"
    v = float(value_us)
    if abs(v) < 1000:
        return f"{v:.0f}us"
    if abs(v) < 1_000_000:
        return f"{v / 1000:.1f}ms" if abs(v) < 100_000 else f"{v / 1000:.0f}ms"
    return f"{v / 1_000_000:.2f}s"
