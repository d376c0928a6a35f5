"""A/B comparison of two runs with bootstrap confidence intervals (``loadgen compare A B``).

``compare_runs(a_dir, b_dir)`` returns a dict (docs/results-format.md, "compare") with, for each
metric (ttft, tpot, itl, e2e, ttft_sched), turn class (all, first, follow-up) and statistic
(p50, p90, p95, p99, mean): A, B, B - A, B / A and 95% bootstrap intervals of both, plus a one-line
verdict per headline metric.

A and B are each run's own figures, as summary.json (and the demo, report, gate and sweep) give
them: ``analysis.distribution`` of the HDR histograms of the run's measured requests
(``hdr.percentile_values``, the one percentile of docs/metrics.md), bit for bit. The bootstrap
resamples the per-request records (raw values: the paired requests when the runs pair up), whose
own estimate (linear interpolation between raw values, over the pairs) can differ from the HDR
one: its intervals are moved by that difference (B - A's by the difference of the deltas, B / A's
by the ratio of the ratios), so they keep their width and sit around the figures printed. The
CDFs plotted are the same histograms'.

Runs with the same seed and workload fingerprint replayed the same sessions, so requests pair up
by (session_id, turn_index) and the bootstrap resamples pairs; otherwise each arm is resampled on
its own. Comparing runs whose seed or workload differ is refused unless ``force``: the difference
would mix the change under test with a change of traffic.

A difference is *significant* when the interval of B / A lies wholly beyond ``min_effect`` (5% by
default: above 1.05, or below 1 / 1.05). The bootstrap resamples requests within each run, so it
cannot see what shifts a whole run a little (another process on the machine, a different batch
interleaving): two runs of one configuration differ by a percent or two with intervals that
exclude 1. ``min_effect=0`` gives the plain test (the interval excludes 1).

A percentile is only judged when the smaller arm has at least ``MIN_TAIL`` (10) values beyond it
(p95 needs 200 requests, p99 1,000): the bootstrap of a percentile that rests on a handful of
values swings with which few requests happened to be slow (a follow-up caught behind another
session's prefill), and calls that a difference. Such rows keep their values and intervals, with
``significant`` None and ``tail`` saying how many values lay beyond.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
from hdrh.histogram import HdrHistogram

from analysis import hdr, hlog
from analysis.bootstrap import Interval, Sample, bootstrap
from analysis.distribution import distribution
from analysis.errors import ResultsError
from analysis.metric_registry import (
    ALL_TURNS,
    COMPARE,
    REGISTRY,
    TURN_CLASS_FIRST,
    TURN_CLASS_FOLLOW_UP,
    metrics_for,
)
from analysis.metric_registry import TURN_CLASSES as REGISTRY_TURN_CLASSES
from analysis.metric_registry import metric as registered_metric
from analysis.records import RequestRecord, parse_histogram_tag, tag_label
from analysis.results import RunResults, load_results
from analysis.summary import summarize_results

COMPARE_SCHEMA_VERSION = 1
METRICS = metrics_for(COMPARE)
# Metrics absent from results written before they existed: compared only where a run has them.
OPTIONAL_METRICS = tuple(m for m in METRICS if registered_metric(m).optional)
TURN_CLASSES = (ALL_TURNS, *REGISTRY_TURN_CLASSES)
PERCENTILES = (50.0, 90.0, 95.0, 99.0)
HEADLINE_STAT = "p95"
DEFAULT_MIN_EFFECT = 0.05
MIN_TAIL = 10  # values beyond a percentile, in the smaller arm, before it is judged
HEADLINES = (
    ("ttft", ALL_TURNS),
    ("ttft", TURN_CLASS_FIRST),
    ("ttft", TURN_CLASS_FOLLOW_UP),
    ("tpot", ALL_TURNS),
    ("itl", ALL_TURNS),
    ("e2e", ALL_TURNS),
)
METRIC_NAMES = {m.name: m.title for m in REGISTRY}
_CDF_POINTS = 200


def compare_runs(
    a_dir: str | Path,
    b_dir: str | Path,
    *,
    force: bool = False,
    n_boot: int = 2000,
    seed: int = 0,
    percentiles: tuple[float, ...] = PERCENTILES,
    confidence: float = 0.95,
    min_effect: float = DEFAULT_MIN_EFFECT,
    headline_stat: str = HEADLINE_STAT,
) -> dict[str, Any]:
    """Compare run B against baseline A (see the module docstring). Raises ``ResultsError`` when the
    runs' seed or workload fingerprint differ, unless ``force``. ``min_effect`` (a fraction, >= 0) is
    the smallest change called significant; ``headline_stat`` (``p50``, ``p95``, ``mean``...: one of
    ``percentiles`` or the mean) is the statistic of the verdicts."""
    if min_effect < 0:
        raise ValueError(f"min_effect must be >= 0 (got {min_effect})")
    stats = (*(f"p{p:g}" for p in percentiles), "mean")
    if headline_stat not in stats:
        raise ValueError(f"headline_stat {headline_stat!r} is not one of {', '.join(stats)}")
    a, b = load_results(a_dir), load_results(b_dir)
    differences = _differences(a, b)
    if differences and not force:
        raise ResultsError(
            f"{a.path} and {b.path} differ in {' and '.join(differences)}: the comparison would mix the change "
            "under test with a change of traffic; rerun with the same --seed and workload, or force it (unpaired)"
        )
    pairs = _pairs(a, b) if not differences else {}
    paired = bool(pairs)
    if differences:
        pairing = f"unpaired: forced across different {' and '.join(differences)}"
    elif not paired:
        pairing = "unpaired: the runs share seed and workload but no (session_id, turn_index)"
    else:
        pairing = f"paired by (session_id, turn_index) over {len(pairs):,} request pairs"
    rows = []
    cdfs: dict[str, dict[str, Any]] = {}
    hists = (_by_metric_and_turn_class(a), _by_metric_and_turn_class(b))
    for metric in METRICS:
        if metric in OPTIONAL_METRICS and not any((metric, "all") in h for h in hists):
            continue  # runs without reasoning fields (older files) have no TTFOT: no rows for it
        for tc in TURN_CLASSES:
            sa, sb, n_pairs = _samples(a, b, metric, tc, pairs)
            ha, hb = (h.get((metric, tc)) for h in hists)
            raw = bootstrap(
                sa, sb, percentiles, paired=paired, n_boot=n_boot, seed=seed, confidence=confidence
            )
            iv = _at_hdr_estimates(raw, _estimates(ha, percentiles), _estimates(hb, percentiles))
            values = min(len(sa.pooled_values()), len(sb.pooled_values()))
            for j, stat in enumerate(iv.stats):
                tail = None if stat == "mean" else round(values * (1 - percentiles[j] / 100), 1)
                row = _row(metric, tc, stat, iv, j, len(sa), len(sb), n_pairs if paired else None, min_effect)
                rows.append({**row, "tail": tail, "significant": _judged(row["significant"], tail)})
            if tc == "all" or metric == "ttft":
                cdfs.setdefault(metric, {})[tc] = {"a": _cdf(ha), "b": _cdf(hb)}
    summaries = (summarize_results(a), summarize_results(b))
    warnings = _warnings(a, b, summaries, differences)
    short = [
        r["stat"] for r in rows if (r["metric"], r["turn_class"]) == ("ttft", "all") and _too_few(r["tail"])
    ]
    if short:
        n = min(r["n_a"] for r in rows if (r["metric"], r["turn_class"]) == ("ttft", "all"))
        warnings.append(
            f"{', '.join(short)} of {n:,} requests rest on under {MIN_TAIL} values beyond them: shown, not judged "
            f"({', '.join(f'{st} needs {needed_for(st):,}' for st in short)})"
        )
    return {
        "schema_version": COMPARE_SCHEMA_VERSION,
        "a": _arm(a, summaries[0]),
        "b": _arm(b, summaries[1]),
        "paired": paired,
        "pairing": pairing,
        "forced": bool(differences),
        "n_boot": n_boot,
        "seed": seed,
        "confidence": confidence,
        "min_effect": min_effect,
        "headline_stat": headline_stat,
        "warnings": warnings,
        "overview": _overview(*summaries),
        "rows": rows,
        "verdicts": [_verdict(rows, m, tc, headline_stat, confidence) for m, tc in HEADLINES],
        "cdf": cdfs,
    }


def find_row(cmp: dict[str, Any], metric: str, turn_class: str, stat: str) -> dict[str, Any] | None:
    """The row of ``cmp["rows"]`` for (metric, turn class, statistic), or None."""
    for r in cmp["rows"]:
        if (r["metric"], r["turn_class"], r["stat"]) == (metric, turn_class, stat):
            return r
    return None


def describe(metric: str, turn_class: str, stat: str) -> str:
    """``follow-up-turn p95 TTFT``, ``p99 ITL``, ``first-turn mean E2E latency``."""
    prefix = "" if turn_class == "all" else f"{turn_class}-turn "
    return f"{prefix}{stat} {METRIC_NAMES.get(metric, metric)}"


TIMES = "\u00d7"  # the multiplication sign, as in "6.8x" written properly


def fmt_factor(x: float) -> str:
    return f"{x:.0f}{TIMES}" if x >= 10 else f"{x:.1f}{TIMES}" if x >= 2 else f"{x:.2f}{TIMES}"


def _differences(a: RunResults, b: RunResults) -> list[str]:
    out = []
    if a.info.get("seed") != b.info.get("seed"):
        out.append(f"seed ({a.info.get('seed')} vs {b.info.get('seed')})")
    fa = (a.info.get("workload") or {}).get("fingerprint")
    fb = (b.info.get("workload") or {}).get("fingerprint")
    if fa != fb:
        out.append(f"workload fingerprint ({fa} vs {fb})")
    return out


def _pairs(a: RunResults, b: RunResults) -> dict[tuple[str, int], tuple[RequestRecord, RequestRecord]]:
    in_b = {(r.session_id, r.turn_index): r for r in b.measured()}
    out = {}
    for r in a.measured():
        other = in_b.get((r.session_id, r.turn_index))
        if other is not None:
            out[(r.session_id, r.turn_index)] = (r, other)
    return out


def _value(rec: RequestRecord, metric: str) -> float | list[int] | None:
    """The request's value in ms (ITL: its list of gaps), successful requests only (as histograms)."""
    if not rec.ok:
        return None
    if metric == "itl":
        return rec.itl_us
    v = {
        "ttft": rec.ttft_us, "tpot": rec.tpot_us, "e2e": rec.e2e_us, "ttft_sched": rec.ttft_sched_us,
        "ttfot": rec.ttfot_us, "tpot_output": rec.tpot_output_us,
    }[metric]  # fmt: skip
    return None if v is None else v / 1000.0


def _sample(values: list[Any], metric: str) -> Sample:
    if metric == "itl":
        return Sample.pooled([np.asarray(v, dtype=float) / 1000.0 for v in values])
    return Sample.scalar(values)


def _samples(a: RunResults, b: RunResults, metric: str, tc: str, pairs) -> tuple[Sample, Sample, int]:
    keep = (lambda r: True) if tc == "all" else (lambda r: r.turn_class == tc)
    if pairs:
        va, vb = [], []
        for ra, rb in pairs.values():
            if keep(ra):
                xa, xb = _value(ra, metric), _value(rb, metric)
                if xa is not None and xb is not None:
                    va.append(xa)
                    vb.append(xb)
        return _sample(va, metric), _sample(vb, metric), len(va)
    va = [v for r in a.measured() if keep(r) and (v := _value(r, metric)) is not None]
    vb = [v for r in b.measured() if keep(r) and (v := _value(r, metric)) is not None]
    return _sample(va, metric), _sample(vb, metric), 0


def _row(metric, tc, stat, iv, j, n_a, n_b, n_pairs, min_effect) -> dict[str, Any]:
    def f(x: float) -> float | None:
        return None if x is None or not np.isfinite(x) else round(float(x), 4)

    lo, hi = f(iv.delta_lo[j]), f(iv.delta_hi[j])
    rlo, rhi = f(iv.ratio_lo[j]), f(iv.ratio_hi[j])
    if lo is None:
        significant = None
    elif rlo is None:  # A is 0: no ratio, so the plain test on B - A
        significant = bool(lo > 0 or hi < 0)
    else:
        significant = bool(rlo > 1 + min_effect or rhi < 1 / (1 + min_effect))
    return {
        "metric": metric,
        "turn_class": tc,
        "stat": stat,
        "unit": "ms",
        "a": f(iv.a[j]),
        "b": f(iv.b[j]),
        "delta": f(iv.delta[j]),
        "ratio": f(iv.ratio[j]),
        "delta_ci": None if lo is None else [lo, hi],
        "ratio_ci": None if rlo is None else [rlo, rhi],
        "n_a": n_a,
        "n_b": n_b,
        "n_pairs": n_pairs,
        "significant": significant,
    }


def _too_few(tail: float | None) -> bool:
    return tail is not None and tail < MIN_TAIL


def _judged(significant: bool | None, tail: float | None) -> bool | None:
    return None if _too_few(tail) else significant


def needed_for(stat: str) -> int:
    """The values an arm needs for ``stat`` (``p95``) to be judged: MIN_TAIL beyond it."""
    return 0 if stat == "mean" else math.ceil(MIN_TAIL / (1 - float(stat[1:]) / 100) - 1e-9)


def too_few_text(row: dict[str, Any]) -> str:
    """``too few values beyond p95 to judge (4.8 of 96; p95 needs 200)``."""
    n = min(row["n_a"], row["n_b"])
    return f"too few values beyond {row['stat']} to judge ({row['tail']:g} of {n:,}; {row['stat']} needs {needed_for(row['stat']):,})"


def _verdict(
    rows: list[dict[str, Any]], metric: str, tc: str, stat: str, confidence: float
) -> dict[str, Any]:
    r = next(x for x in rows if (x["metric"], x["turn_class"], x["stat"]) == (metric, tc, stat))
    what = describe(metric, tc, stat)
    out = {"metric": metric, "turn_class": tc, "stat": stat, "significant": r["significant"]}
    if _too_few(r["tail"]) and r["ratio_ci"] is not None:
        out["text"] = f"{what}: {too_few_text(r)}"
        return out
    if r["significant"] is None or r["ratio_ci"] is None:
        out["text"] = f"{what}: too few requests to compare (A {r['n_a']}, B {r['n_b']})"
        return out
    ratio, (lo, hi) = r["ratio"], r["ratio_ci"]
    change = f"({_ms(r['a'])} → {_ms(r['b'])})"
    if r["significant"] and ratio < 1:
        out["text"] = (
            f"B cuts {what} {fmt_factor(1 / ratio)} [{fmt_factor(1 / hi)}, {fmt_factor(1 / lo)}] {change}"
        )
    elif r["significant"]:
        out["text"] = f"B raises {what} {fmt_factor(ratio)} [{fmt_factor(lo)}, {fmt_factor(hi)}] {change}"
    else:
        out["text"] = (
            f"{what}: no significant difference (B/A {fmt_factor(ratio)} [{fmt_factor(lo)}, {fmt_factor(hi)}], "
            f"{confidence:.0%} interval)"
        )
    return out


def _ms(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.2f} ms" if v < 10 else f"{v:.1f} ms" if v < 1000 else f"{v / 1000:.2f} s"


def _by_metric_and_turn_class(res: RunResults) -> dict[tuple[str, str], HdrHistogram]:
    """The run's histograms of its measured requests (``RunResults.histograms``: what summary.json
    is computed from) merged per (metric, turn class), "all" included, as ``summary`` merges them."""
    out: dict[tuple[str, str], HdrHistogram] = {}
    classes = {tag_label(tc): tc for tc in TURN_CLASSES if tc != "all"}
    for tag, h in res.histograms().items():
        metric, tc, _tenant, _target = parse_histogram_tag(tag)
        for key in ((metric, "all"), (metric, classes.get(tc))):
            if key[1] is None:
                continue
            merged = out.get(key)
            if merged is None:
                merged = out[key] = hlog.new_histogram()
            merged.add(h)
    return out


def _estimates(h: HdrHistogram | None, percentiles: tuple[float, ...]) -> np.ndarray:
    """The run's own figures (ms): each percentile then the mean, exactly as summary.json has them."""
    d = distribution(h, percentiles=percentiles)
    keys = [*(f"p{p:g}" for p in percentiles), "mean"]
    return np.array([np.nan if d[k] is None else d[k] for k in keys], dtype=float)


def _at_hdr_estimates(raw: Interval, a: np.ndarray, b: np.ndarray) -> Interval:
    """``raw`` (the bootstrap of the records) with the runs' own estimates ``a`` and ``b``, and its
    intervals moved by the difference between the two estimates (see the module docstring)."""
    delta_shift = (b - a) - raw.delta
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(a > 0, b / np.where(a > 0, a, 1), np.nan)
        factor = np.where(raw.ratio > 0, ratio / np.where(raw.ratio > 0, raw.ratio, 1), np.nan)
    return Interval(
        raw.stats,
        a,
        b,
        raw.delta_lo + delta_shift,
        raw.delta_hi + delta_shift,
        raw.ratio_lo * factor,
        raw.ratio_hi * factor,
    )


def _cdf(h: HdrHistogram | None) -> list[list[float]]:
    """[value_ms, fraction] at each bucket (thinned to a few hundred): an overlaid CDF plot of the
    same histogram the table's figures come from."""
    if h is None or not h.get_total_count():
        return []
    x, frac = hdr.cdf(hdr.bins(h), max_points=_CDF_POINTS)
    return [[round(float(v) / 1000.0, 4), round(float(p), 4)] for v, p in zip(x, frac, strict=True)]


def _arm(res: RunResults, summary: dict[str, Any]) -> dict[str, Any]:
    keep = ("label", "url", "adapter", "kind", "identity", "labels", "cost_per_hour_usd")
    return {
        "dir": str(res.path),
        "run_id": res.run_id,
        "status": res.status,
        "partial": res.partial,
        "seed": res.info.get("seed"),
        "workload": res.info.get("workload") or {},
        "mode": summary["mode"],
        "arrival": summary["arrival"],
        "targets": [{**{k: t.get(k) for k in keep}, "fleet": _fleet(t)} for t in summary["targets"]],
        "requests": summary["requests"]["measured"],
        "notes": summary["notes"],
    }


def _fleet(target: dict[str, Any]) -> dict[str, Any] | None:
    """An embedded fleet in brief: its router (name, version, policy) and replica count."""
    fleet = target.get("fleet")
    if not isinstance(fleet, dict):
        return None
    router = fleet.get("router") or {}
    return {
        "engine": fleet.get("engine"),
        "replicas": len(fleet.get("replicas") or []),
        "router": {k: router.get(k) for k in ("name", "version", "policy")} if router else None,
    }


def _overview(sa: dict[str, Any], sb: dict[str, Any]) -> list[dict[str, Any]]:
    """Run-level figures side by side (no intervals: one number a run)."""
    items = [
        ("requests/s", sa["throughput"]["requests_per_s"], sb["throughput"]["requests_per_s"]),
        ("output tokens/s", sa["throughput"]["output_tokens_per_s"], sb["throughput"]["output_tokens_per_s"]),
        ("error rate", sa["errors"]["rate"], sb["errors"]["rate"]),
        ("SLO attainment", sa["slo"]["attainment"], sb["slo"]["attainment"]),
        ("goodput requests/s", sa["slo"]["goodput_requests_per_s"], sb["slo"]["goodput_requests_per_s"]),
        (
            "output tokens/$",
            (sa["cost"] or {}).get("output_tokens_per_usd"),
            (sb["cost"] or {}).get("output_tokens_per_usd"),
        ),
        *_energy_items(sa, sb),
        (
            "schedule lag p99 ms",
            sa["generator"]["schedule_lag_p99_ms"],
            sb["generator"]["schedule_lag_p99_ms"],
        ),
    ]
    out = []
    for name, x, y in items:
        ratio = round(y / x, 4) if x and y is not None else None
        out.append({"name": name, "a": x, "b": y, "ratio": ratio})
    return out


ENERGY_FIGURES = (
    ("average GPU power W", "average_power_w"),
    ("GPU energy J", "energy_j"),
    ("output tokens/J", "output_tokens_per_joule"),
    ("J per 1M output tokens", "joules_per_1m_output_tokens"),
)


def _energy_items(sa: dict[str, Any], sb: dict[str, Any]) -> list[tuple[str, float | None, float | None]]:
    """The energy figures side by side when either run scraped GPU power (``--power-metrics``)."""
    ea, eb = sa.get("energy") or {}, sb.get("energy") or {}
    if not ea and not eb:
        return []
    return [(name, ea.get(key), eb.get(key)) for name, key in ENERGY_FIGURES]


def _connections(res: RunResults) -> str:
    """A run's ``--connections``: runs from before the option connected once per session."""
    return str((res.info.get("config") or {}).get("connections") or "per-session")


def _warnings(a: RunResults, b: RunResults, summaries, differences: list[str]) -> list[str]:
    out = []
    if differences:
        out.append(f"forced: the runs differ in {' and '.join(differences)}; intervals are unpaired")
    for name, res, s in (("A", a, summaries[0]), ("B", b, summaries[1])):
        if res.partial:
            out.append(f"{name} is partial: {res.partial_reason}")
        if s["generator_saturated"]:
            out.append(
                f"{name}'s generator was saturated (schedule lag p99 {s['generator']['schedule_lag_p99_ms']} ms)"
            )
    sa, sb = summaries
    if sa["mode"] != sb["mode"] or sa["arrival"] != sb["arrival"]:
        out.append("the runs' arrival processes differ: " + f"A {sa['arrival']} vs B {sb['arrival']}")
    if (a.info.get("warmup_s"), a.info.get("duration_s")) != (
        b.info.get("warmup_s"),
        b.info.get("duration_s"),
    ):
        out.append("the runs' warm-up or duration differ")
    ca, cb = _connections(a), _connections(b)
    if ca != cb:
        out.append(
            f"the runs' connections differ (A {ca}, B {cb}): a session that connects and closes its own "
            "costs the server a connect and a close that a pooled one does not; that difference is the "
            "client's, not the target's"
        )
    ids_a = [t.get("identity") for t in sa["targets"]]
    if ids_a == [t.get("identity") for t in sb["targets"]] and any(ids_a):
        out.append("A and B report the same target identity: is this an A/A (noise) check?")
    return out


__all__ = [
    "COMPARE_SCHEMA_VERSION",
    "DEFAULT_MIN_EFFECT",
    "HEADLINES",
    "METRICS",
    "MIN_TAIL",
    "OPTIONAL_METRICS",
    "compare_runs",
    "describe",
    "find_row",
    "needed_for",
    "too_few_text",
]
