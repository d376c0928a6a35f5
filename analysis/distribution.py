"""One HDR histogram as the figures a summary prints: count, min, mean, max and percentiles.

The one place a distribution's figures are computed (the summary, the TTFT split and the A/B
comparison all call it); the percentiles themselves come from ``analysis.hdr``.
"""

from __future__ import annotations

from typing import Any

from hdrh.histogram import HdrHistogram

from analysis import hdr
from analysis.slo import stat_key

PERCENTILES = (50.0, 90.0, 95.0, 99.0, 99.9)


def distribution(
    h: HdrHistogram | None, *, unit: str = "ms", percentiles: tuple[float, ...] = PERCENTILES
) -> dict[str, Any]:
    """count, unit, min, mean, max and each percentile (``p50`` .. ``p99.9``) of an HDR histogram.

    Durations (µs in the histogram) are reported in ms; ``unit="tokens"`` reports raw values.
    Values are hdrh's own (a percentile is the highest value equivalent to its bucket).
    """
    n = 0 if h is None else h.get_total_count()
    out: dict[str, Any] = {"count": n, "unit": unit}
    keys = ["min", "mean", "max", *(stat_key(p) for p in percentiles)]
    if not n:
        out.update(dict.fromkeys(keys))
        return out
    assert h is not None
    scale = 1000.0 if unit == "ms" else 1.0
    b = hdr.bins(h)
    out["min"] = _round(int(b.lowest[0]) / scale)
    out["mean"] = _round(hdr.mean(b) / scale)
    out["max"] = _round(int(b.highest[-1]) / scale)
    for p, v in zip(percentiles, hdr.value_at_percentiles(b, percentiles), strict=True):
        out[stat_key(p)] = _round(v / scale)
    return out


def _round(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(float(x), nd)
