"""Service-level objectives: parsing ``ttft_p99=500ms,itl_p99=50ms,ttft=1s,tpot=80ms`` and checking them.

Two kinds (docs/metrics.md):

* **percentile SLOs**, ``<metric>_p<NN>=<duration>`` (or ``<metric>_mean``): hold for a run when the
  run's percentile is at or under the limit. Metrics: ttft, ttft_sched, tpot, itl, e2e, schedule_lag.
  These decide ``sweep``'s max rate, the gate and the run's exit code.
* **per-request SLOs**, ``ttft|tpot|itl_max|e2e=<duration>``: a request meets them when it succeeded
  and each of its values is at or under its limit. They define SLO attainment and goodput.

``:`` is accepted in place of ``=``. Items are separated by commas.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from analysis.metric_registry import SLO, metrics_for
from analysis.records import RequestRecord
from analysis.units import parse_duration_s

PERCENTILE_METRICS = metrics_for(SLO)
REQUEST_SLO_KEYS = ("ttft", "ttfot", "tpot", "itl_max", "e2e")

SLO_FORM = (
    "use metric_pNN=duration for a percentile SLO (metrics: "
    + ", ".join(PERCENTILE_METRICS)
    + "; e.g. ttft_p99=500ms, "
    "itl_p99.9=80ms, tpot_mean=40ms) or "
    + "|".join(REQUEST_SLO_KEYS)
    + "=duration for a per-request SLO (e.g. tpot=80ms)"
)

_PCT_RE = re.compile(
    r"^("
    + "|".join(sorted(PERCENTILE_METRICS, key=len, reverse=True))
    + r")_(?:p([0-9]+(?:\.[0-9]+)?)|(mean))$"
)


def stat_key(percentile: float | None) -> str:
    """The summary key of a statistic: ``p99``, ``p99.9``, ``mean`` (None)."""
    return "mean" if percentile is None else f"p{percentile:g}"


@dataclass(frozen=True, slots=True)
class PercentileSlo:
    """``<metric>_<stat> <= limit``; ``percentile`` None means the mean."""

    metric: str
    percentile: float | None
    limit_us: float

    @property
    def key(self) -> str:
        return f"{self.metric}_{stat_key(self.percentile)}"

    @property
    def limit_ms(self) -> float:
        return self.limit_us / 1000.0

    def __str__(self) -> str:
        return f"{self.key}={_fmt_limit(self.limit_us)}"


@dataclass(frozen=True, slots=True)
class RequestSlo:
    """A limit every single request must meet: ``ttft``, ``ttfot``, ``tpot``, ``itl_max`` or ``e2e``."""

    metric: str
    limit_us: float

    @property
    def limit_ms(self) -> float:
        return self.limit_us / 1000.0

    def value_us(self, rec: RequestRecord) -> float | None:
        if self.metric == "ttft":
            return rec.ttft_us
        if self.metric == "ttfot":
            return rec.ttfot_us
        if self.metric == "tpot":
            return rec.tpot_us
        if self.metric == "e2e":
            return rec.e2e_us
        return max(rec.itl_us) if rec.itl_us else None

    def met_by(self, rec: RequestRecord) -> bool:
        """Errors never meet an SLO. A TPOT or max ITL that does not exist (under two tokens) has
        nothing to violate; a missing TTFT, TTFOT (a reply of reasoning only) or E2E on a successful
        request is a miss."""
        if not rec.ok:
            return False
        v = self.value_us(rec)
        if v is None:
            return self.metric in ("tpot", "itl_max")
        return v <= self.limit_us

    def __str__(self) -> str:
        return f"{self.metric}={_fmt_limit(self.limit_us)}"


@dataclass(frozen=True, slots=True)
class Slos:
    """A parsed set of SLOs. Falsy when empty."""

    percentile: tuple[PercentileSlo, ...] = ()
    per_request: tuple[RequestSlo, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.percentile or self.per_request)

    def __str__(self) -> str:
        return ",".join(str(s) for s in (*self.percentile, *self.per_request))

    def texts(self) -> list[str]:
        return [str(s) for s in (*self.percentile, *self.per_request)]

    def request_meets(self, rec: RequestRecord) -> bool:
        """True when ``rec`` succeeded and meets every per-request SLO."""
        return rec.ok and all(s.met_by(rec) for s in self.per_request)

    @property
    def percentiles(self) -> set[float]:
        return {s.percentile for s in self.percentile if s.percentile is not None}


def parse_slos(spec: str | Iterable[str] | Slos | None) -> Slos:
    """Parse ``"ttft_p99=500ms,itl_p99=50ms,ttft=1s,tpot=80ms"`` (or a list of such strings).

    Raises ``ValueError`` with a one-line message that shows the accepted forms.
    """
    if spec is None:
        return Slos()
    if isinstance(spec, Slos):
        return spec
    items = spec.split(",") if isinstance(spec, str) else [x for s in spec for x in str(s).split(",")]
    percentile: dict[str, PercentileSlo] = {}
    per_request: dict[str, RequestSlo] = {}
    for raw in items:
        item = raw.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep:
            key, sep, value = item.partition(":")
        key = key.strip().lower()
        if not sep or not key:
            raise ValueError(f"{item!r} is not an SLO; {SLO_FORM}")
        try:
            limit_s = parse_duration_s(value.strip())
        except ValueError:
            raise ValueError(f"{item!r}: {value.strip()!r} is not a duration; use e.g. 500ms, 1.5s") from None
        if limit_s <= 0:
            raise ValueError(f"{item!r}: the limit must be greater than 0")
        if key in percentile or key in per_request:
            raise ValueError(f"{item!r}: {key} is given twice")
        m = _PCT_RE.match(key)
        if m:
            pct = None if m.group(3) else float(m.group(2))
            if pct is not None and not 0 < pct <= 100:
                raise ValueError(f"{item!r}: the percentile must be in (0, 100]")
            percentile[key] = PercentileSlo(m.group(1), pct, limit_s * 1e6)
        elif key in REQUEST_SLO_KEYS:
            per_request[key] = RequestSlo(key, limit_s * 1e6)
        else:
            raise ValueError(f"{item!r} is not an SLO; {SLO_FORM}")
    return Slos(tuple(percentile.values()), tuple(per_request.values()))


def evaluate_percentile_slos(
    summary: Mapping[str, Any], slos: str | Iterable[str] | Slos | None
) -> list[tuple[PercentileSlo, float | None, bool]]:
    """``(slo, observed_ms, ok)`` for each percentile SLO against ``summary["metrics"]``.

    ``summary`` is a summary dict (or any of its groups, e.g. ``summary["by_target"]["a"]``). A
    statistic the summary lacks, or a metric with no values, is ``(slo, None, False)``: an SLO that
    cannot be shown to hold does not hold.
    """
    out = []
    metrics = summary.get("metrics") or {}
    for slo in parse_slos(slos).percentile:
        dist = metrics.get(slo.metric) or {}
        observed = dist.get(stat_key(slo.percentile)) if dist.get("count") else None
        out.append((slo, observed, observed is not None and observed * 1000.0 <= slo.limit_us))
    return out


def _fmt_limit(limit_us: float) -> str:
    if limit_us >= 1e6 and limit_us % 1e6 == 0:
        return f"{limit_us / 1e6:g}s"
    if limit_us >= 1e3:
        return f"{limit_us / 1e3:g}ms"
    return f"{limit_us:g}us"


__all__ = [
    "PERCENTILE_METRICS",
    "REQUEST_SLO_KEYS",
    "PercentileSlo",
    "RequestSlo",
    "Slos",
    "evaluate_percentile_slos",
    "parse_slos",
    "stat_key",
]
