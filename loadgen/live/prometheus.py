"""What the master's ``/metrics`` endpoint exports: metric families built from a ``RunSnapshot``.

Everything comes from what the master (or the single local process) already keeps for the run:
the exactly merged cumulative HDR histograms, the per-label totals counted as records arrive, and
the workers' last reported in-flight state. Nothing here runs per request; ``collect`` runs once
per scrape (cached by the endpoint), and costs one cumulative sum per histogram plus one
percentile query. Metric names and labels are documented in docs/prometheus.md; the Grafana
dashboard (k8s/grafana/loadgen-dashboard.json) and its test use ``EXPORTED_NAMES``.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from analysis.hdr import value_at_percentile
from analysis.hlog import new_histogram
from analysis.metric_registry import PROMETHEUS, metric, metrics_for
from analysis.records import ERROR_CATEGORIES, parse_histogram_tag
from loadgen.live.exposition import COUNTER, GAUGE, HISTOGRAM, BucketLayout, Family, add_histogram
from loadgen.live.snapshot import RunSnapshot

LABEL_NAMES = ("turn_class", "tenant", "target")

# results-format metric name -> (exported histogram, help), from the registry. tokens_per_chunk is
# a count, not a time, and stays in the results files.
HISTOGRAMS: dict[str, tuple[str, str]] = {
    name: (str(metric(name).exported_as), metric(name).definition) for name in metrics_for(PROMETHEUS)
}

COUNTERS: dict[str, str] = {
    "loadgen_requests_total": "Requests finished, by status (ok or error).",
    "loadgen_errors_total": "Failed requests by error category.",
    "loadgen_output_tokens_total": "Output tokens received (usage.completion_tokens, else token-bearing chunks).",
    "loadgen_input_tokens_total": "Prompt tokens sent, as the server reported them.",
    "loadgen_sessions_started_total": "Agent sessions started.",
    "loadgen_requests_meeting_slo_total": "Requests that met every per-request SLO (--slo ttft=...,tpot=...).",
}

GAUGES: dict[str, str] = {
    "loadgen_sessions_in_flight": "Sessions started and not finished, as of the workers' last reports.",
    "loadgen_requests_in_flight": "Requests on the wire, as of the workers' last reports.",
    "loadgen_schedule_lag_p99_seconds": "p99 schedule lag over the run so far (all labels).",
    "loadgen_schedule_lag_bound_seconds": "Schedule-lag p99 above which the run is flagged generator-saturated.",
    "loadgen_workers": "Worker processes by state: active (holding a slot), lost, standby.",
    "loadgen_run_info": "The current run: run id, workload, seed, mode, arrival process and rate.",
    "loadgen_run_start_time_seconds": "When the run's schedule starts (Unix time).",
    "loadgen_run_end_time_seconds": "When the run's results were closed (Unix time); 0 while it runs.",
    "loadgen_gpu_energy_joules": "GPU energy since the run's start, per --power-metrics endpoint (J).",
    "loadgen_gpu_power_watts": "Average GPU power since the run's start, per --power-metrics endpoint (W).",
    "loadgen_output_tokens_per_joule": "Output tokens received per joule of GPU energy since the run's start (every endpoint).",
    "loadgen_joules_per_million_output_tokens": "GPU energy per 1M output tokens since the run's start (J, every endpoint).",
}
POWER_LIVE_FILE = "power-live.json"  # written each second by the front's power loop (loadgen/commands/power_scrape.py)

EXPORTED_NAMES: tuple[str, ...] = (*(name for name, _ in HISTOGRAMS.values()), *COUNTERS, *GAUGES)


@cache
def bucket_layout() -> BucketLayout:
    """The ``le`` bounds of loadgen's histogram configuration (1 µs .. 1 h, 3 digits)."""
    return BucketLayout.for_histogram(new_histogram())


def collect(snap: RunSnapshot) -> list[Family]:
    """Every family for the current run (none before the first run starts)."""
    cfg = snap.config
    if cfg is None:
        return []
    fams = {name: Family(name, COUNTER, text) for name, text in COUNTERS.items()}
    fams.update({name: Family(name, GAUGE, text) for name, text in GAUGES.items()})
    agg = snap.aggregate
    _add_run(fams, snap, cfg)
    histograms = _histograms(agg)
    for key, totals in sorted(agg.by_labels.items()):
        labels = dict(zip(LABEL_NAMES, key, strict=True))
        fams["loadgen_requests_total"].add(totals.ok, {**labels, "status": "ok"})
        fams["loadgen_requests_total"].add(totals.failed, {**labels, "status": "error"})
        # Every known category, zeros included: a rate() over a series that appears late misses
        # its first errors.
        for category in sorted({*ERROR_CATEGORIES, *totals.errors}):
            fams["loadgen_errors_total"].add(totals.errors.get(category, 0), {**labels, "category": category})
        fams["loadgen_output_tokens_total"].add(totals.output_tokens, labels)
        fams["loadgen_input_tokens_total"].add(totals.input_tokens, labels)
    if agg.slo_total:
        fams["loadgen_requests_meeting_slo_total"].add(agg.slo_met)
    fams["loadgen_sessions_started_total"].add(snap.sessions_started)
    fams["loadgen_sessions_in_flight"].add(snap.sessions_in_flight)
    fams["loadgen_requests_in_flight"].add(snap.requests_in_flight)
    lag = agg.combined("schedule_lag")
    if lag.get_total_count():
        fams["loadgen_schedule_lag_p99_seconds"].add(value_at_percentile(lag, 99.0) / 1e6)
    fams["loadgen_schedule_lag_bound_seconds"].add(cfg.max_schedule_lag_us / 1e6)
    _add_power(fams, cfg, sum(t.output_tokens for t in agg.by_labels.values()))
    return [*histograms, *fams.values()]


def _add_power(fams: dict[str, Family], cfg: Any, output_tokens: int) -> None:
    """The energy gauges, from the front's ``power-live.json`` (absent: no --power-metrics, or the
    loop's first figure is not in yet). A small file read at most once a second (the endpoint's cache)."""
    import orjson

    try:
        live = orjson.loads((Path(cfg.results_dir) / cfg.run_id / POWER_LIVE_FILE).read_bytes())
        rows = [
            ({"source": str(s.get("source", "")), "target": str(s.get("target") or "")}, float(s["energy_j"]),
             None if s.get("average_power_w") is None else float(s["average_power_w"]))
            for s in live["sources"]
        ]  # fmt: skip
    except (OSError, TypeError, KeyError, ValueError, AttributeError):  # orjson's error is a ValueError
        return  # a file caught mid-replace or not the front's: no gauges this scrape rather than a wrong one
    total = 0.0
    for labels, energy_j, power_w in rows:
        fams["loadgen_gpu_energy_joules"].add(energy_j, labels)
        if power_w is not None:
            fams["loadgen_gpu_power_watts"].add(power_w, labels)
        total += energy_j
    if live.get("complete") and total > 0:  # a ratio that left out an endpoint would be false
        fams["loadgen_output_tokens_per_joule"].add(output_tokens / total)
        if output_tokens:
            fams["loadgen_joules_per_million_output_tokens"].add(total / output_tokens * 1e6)


def _histograms(agg: Any) -> list[Family]:
    layout = bucket_layout()
    fams = {metric: Family(name, HISTOGRAM, text) for metric, (name, text) in HISTOGRAMS.items()}
    for tag, h in sorted(agg.cumulative.items()):
        metric, *key = parse_histogram_tag(tag)
        fam = fams.get(metric)
        if fam is None:
            continue
        totals = agg.by_labels.get(tuple(key))
        sum_us = totals.sums_us.get(metric, 0) if totals is not None else 0
        add_histogram(fam, h, layout, dict(zip(LABEL_NAMES, key, strict=True)), sum_us / 1e6)
    return list(fams.values())


def _add_run(fams: dict[str, Family], snap: RunSnapshot, cfg: Any) -> None:
    info = {
        "run_id": cfg.run_id,
        "workload": cfg.workload,
        "seed": str(cfg.seed),
        "mode": cfg.mode,
        "arrival": cfg.arrival if not cfg.concurrency else "closed-loop",
        "rate_per_s": "" if cfg.rate_per_s is None or cfg.concurrency else f"{cfg.rate_per_s:g}",
    }
    fams["loadgen_run_info"].add(1, info)
    fams["loadgen_run_start_time_seconds"].add(snap.t0_unix_s)
    fams["loadgen_run_end_time_seconds"].add(snap.t_end_unix_s or 0.0)
    for state, n in snap.workers.items():
        fams["loadgen_workers"].add(n, {"state": state})


__all__ = ["EXPORTED_NAMES", "HISTOGRAMS", "LABEL_NAMES", "bucket_layout", "collect"]
