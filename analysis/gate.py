"""The CI gate: does a run hold its SLOs and not regress against a baseline beyond noise?

``gate(run_dir, baseline_dir, max_regression={"ttft_p99": 0.10}, slos="ttft_p99=500ms")`` fails when

* a statistic regressed for sure: the lower bound of the 95% interval of run/baseline is above
  ``1 + tolerance`` (a ratio that merely *might* be over, because of noise, passes);
* a percentile cannot be judged: fewer than ``compare.MIN_TAIL`` values lie beyond it (p99 over
  fewer than 1,000 requests). That fails every time, not by chance: gate a lower percentile or run
  longer;
* a percentile SLO is missed on the run, or SLO attainment is under ``min_attainment``;
* the error rate is over ``max_error_rate``;
* the run (or the baseline) is partial, or the run's generator was saturated: its numbers are not
  trustworthy enough to pass anything.

Every failure is one line in ``reasons``; ``checks`` lists every check, passed or not.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analysis.compare import METRICS as COMPARE_METRICS
from analysis.compare import (
    MIN_TAIL,
    PERCENTILES,
    compare_runs,
    describe,
    find_row,
    fmt_factor,
    too_few_text,
)
from analysis.compare import TURN_CLASSES as COMPARE_TURN_CLASSES
from analysis.slo import Slos
from analysis.summary import summarize
from analysis.summary_format import fmt_ms

_KEY_RE = re.compile(
    r"^("
    + "|".join(sorted(COMPARE_METRICS, key=len, reverse=True))
    + r")_(p[0-9.]+|mean)(?:@("
    + "|".join(COMPARE_TURN_CLASSES)
    + r"))?$"
)
KEY_FORM = (
    "metric_stat[@turn_class], e.g. ttft_p99, itl_p95@all, ttft_p95@follow-up, e2e_mean (metrics: "
    + ", ".join(COMPARE_METRICS)
    + ")"
)


@dataclass(frozen=True)
class GateResult:
    """``ok`` is the verdict; ``reasons`` one line per failure; ``checks`` one line per check."""

    ok: bool
    reasons: list[str]
    checks: list[str] = field(default_factory=list)
    comparison: dict[str, Any] | None = field(default=None, repr=False)

    def __bool__(self) -> bool:
        return self.ok


def gate(
    run_dir: str | Path,
    baseline_dir: str | Path | None = None,
    max_regression: Mapping[str, float | str] | None = None,
    slos: str | list[str] | Slos | None = None,
    *,
    min_attainment: float | None = None,
    max_error_rate: float | None = None,
    force: bool = False,
    n_boot: int = 2000,
    seed: int = 0,
) -> GateResult:
    """Judge ``run_dir`` (see the module docstring). ``max_regression`` maps ``metric_stat[@turn_class]``
    to a tolerance (0.10 or "10%"); it needs ``baseline_dir``. ``slos`` defaults to the run's own."""
    tolerances = parse_max_regression(max_regression or {})
    if tolerances and baseline_dir is None:
        raise ValueError("max_regression needs a baseline run to compare against")
    reasons: list[str] = []
    checks: list[str] = []

    def check(ok: bool, line: str) -> None:
        checks.append(("pass  " if ok else "FAIL  ") + line)
        if not ok:
            reasons.append(line)

    summary = summarize(run_dir, slos=slos)
    check(
        not summary["partial"],
        "run is complete" if not summary["partial"] else f"run is partial: {summary['partial_reason']}",
    )
    gen = summary["generator"]
    check(
        not gen["saturated"],
        f"generator {'saturated' if gen['saturated'] else 'kept up'}: schedule lag p99 "
        f"{fmt_ms(gen['schedule_lag_p99_ms'])} ms (bound {gen['saturation_bound_ms']:g} ms)",
    )
    for c in summary["slo"]["percentile"]:
        observed = "no data" if c["observed_ms"] is None else f"observed {fmt_ms(c['observed_ms'])} ms"
        check(c["ok"], f"SLO {c['slo']} {'met' if c['ok'] else 'missed'}: {observed}")
    attainment = summary["slo"]["attainment"]
    if min_attainment is not None:
        ok = attainment is not None and attainment >= min_attainment
        shown = "-" if attainment is None else f"{attainment:.1%}"
        check(ok, f"SLO attainment {shown} {'>=' if ok else 'is under'} the {min_attainment:.1%} required")
    if max_error_rate is not None:
        rate = summary["errors"]["rate"] or 0.0
        check(rate <= max_error_rate, f"error rate {rate:.2%} (at most {max_error_rate:.2%} allowed)")
    if not summary["requests"]["ok"]:
        check(False, "no successful request: nothing to judge")

    cmp = None
    if baseline_dir is not None and tolerances:
        pcts = tuple(sorted({*PERCENTILES, *(float(s[1:]) for (_, s, _) in tolerances if s != "mean")}))
        cmp = compare_runs(baseline_dir, run_dir, force=force, n_boot=n_boot, seed=seed, percentiles=pcts)
        if cmp["a"]["partial"]:
            check(
                False, f"baseline {cmp['a']['run_id']} is partial: a regression check against it means little"
            )
        for (metric, stat, tc), tol in tolerances.items():
            check(*_regression(cmp, metric, stat, tc, tol))
    return GateResult(not reasons, reasons, checks, cmp)


def parse_max_regression(spec: Mapping[str, float | str]) -> dict[tuple[str, str, str], float]:
    """``{"ttft_p99": 0.1, "itl_p95@follow-up": "5%"}`` -> ``{("ttft", "p99", "all"): 0.1, ...}``."""
    out = {}
    for key, value in spec.items():
        m = _KEY_RE.match(key.strip())
        if not m:
            raise ValueError(f"max_regression key {key!r} is not {KEY_FORM}")
        stat = m.group(2)
        if stat != "mean":
            try:
                p = float(stat[1:])
            except ValueError:
                raise ValueError(f"max_regression key {key!r}: {stat!r} is not a percentile") from None
            if not 0 < p < 100:
                raise ValueError(f"max_regression key {key!r}: the percentile must be in (0, 100)")
            stat = f"p{p:g}"
        out[(m.group(1), stat, m.group(3) or "all")] = _tolerance(key, value)
    return out


def _tolerance(key: str, value: float | str) -> float:
    try:
        tol = (
            float(value.strip().removesuffix("%")) / 100
            if isinstance(value, str) and value.strip().endswith("%")
            else float(value)
        )
    except ValueError:
        raise ValueError(
            f"max_regression {key}: {value!r} is not a tolerance; use e.g. 0.10 or 10%"
        ) from None
    if tol < 0:
        raise ValueError(f"max_regression {key}: the tolerance must be >= 0")
    return tol


def _regression(cmp: dict[str, Any], metric: str, stat: str, tc: str, tol: float) -> tuple[bool, str]:
    key = f"{metric}_{stat}" + ("" if tc == "all" else f"@{tc}")
    r = find_row(cmp, metric, tc, stat)
    allowed = fmt_factor(1 + tol)
    if r is None or r["ratio_ci"] is None:
        n = "" if r is None else f" (baseline {r['n_a']}, run {r['n_b']})"
        return False, f"{key}: too few requests to judge a regression{n}"
    if r.get("tail") is not None and r["tail"] < MIN_TAIL:
        return False, f"{key}: {too_few_text(r)}; gate a lower percentile or run longer"
    lo, hi = r["ratio_ci"]
    shown = f"{fmt_factor(r['ratio'])} [{fmt_factor(lo)}, {fmt_factor(hi)}] of baseline"
    change = f"{describe(metric, tc, stat)} {fmt_ms(r['a'])} -> {fmt_ms(r['b'])} ms"
    if lo > 1 + tol:
        return False, f"{key} regressed: {shown}, over the {allowed} allowed ({change})"
    if r["ratio"] is not None and r["ratio"] > 1 + tol:
        return True, f"{key} not shown over {allowed} (the interval reaches below it): {shown} ({change})"
    return True, f"{key} within {allowed}: {shown} ({change})"


__all__ = ["KEY_FORM", "GateResult", "gate", "parse_max_regression"]
