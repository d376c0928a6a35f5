"""``summary.json``: the numbers of one run, rebuilt from its results directory.

``summarize(run_dir)`` returns the summary dict (schema: docs/results-format.md, version
``SUMMARY_SCHEMA_VERSION``); ``write_summary`` writes it next to the results. Definitions are
docs/metrics.md: latency distributions come from HDR histograms merged exactly (never averaged
percentiles); throughput counts requests that finished inside the measurement window; errors and
SLO attainment are over the measured requests (intended after warm-up, drain included), with errors
counted as misses; goodput is the rate at which requests finish times the share that meet the SLOs.

Every group (all traffic, each turn class, tenant, target, model and hardware label) has the same
shape: ``requests``, ``throughput``, ``errors``, ``metrics``, ``slo`` and ``cost``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import orjson
from hdrh.histogram import HdrHistogram

from analysis import generator_health, hlog
from analysis.distribution import PERCENTILES, distribution
from analysis.metric_registry import TURN_CLASSES
from analysis.prompt_check import prompt_tokens_check
from analysis.records import (
    CLIENT_ERROR_CATEGORIES,
    CUT_AT_STOP,
    ERROR_CATEGORIES,
    GENERATOR_ERROR_CATEGORIES,
    METRICS,
    SCHEMA_VERSION,
    SUMMARY_FILE,
    RequestRecord,
    parse_histogram_tag,
    tag_label,
)
from analysis.results import RunResults, load_results
from analysis.sessions import session_stats, step_kind_stats
from analysis.slo import Slos, evaluate_percentile_slos, parse_slos, stat_key
from analysis.summary_format import format_summary, summary_to_csv  # re-exported: one import for callers
from analysis.ttft_split import ttft_split
from analysis.usage_check import usage_check, usage_note

SUMMARY_SCHEMA_VERSION = 1
DEFAULT_SATURATION_LAG_MS = 10.0

CostArg = float | Mapping[str, float] | None


def summarize(
    run_dir: str | Path,
    *,
    slos: str | list[str] | Slos | None = None,
    cost_per_hour_usd: CostArg = None,
    saturation_lag_ms: float | None = None,
) -> dict[str, Any]:
    """The summary of the run in ``run_dir`` (see the module docstring and docs/results-format.md).

    ``slos`` replaces the run's own (``run.json: slos``). ``cost_per_hour_usd`` prices targets: a
    number applies to every target, a mapping by target label; either overrides run.json.
    ``saturation_lag_ms`` is the schedule-lag p99 above which the generator counts as saturated
    (default: run.json ``max_schedule_lag_us``, else 10 ms).
    """
    return summarize_results(
        load_results(run_dir),
        slos=slos,
        cost_per_hour_usd=cost_per_hour_usd,
        saturation_lag_ms=saturation_lag_ms,
    )


def write_summary(run_dir: str | Path, **kwargs: Any) -> Path:
    """Write ``summary.json`` into ``run_dir`` (atomically) and return its path."""
    summary = summarize(run_dir, **kwargs)
    path = Path(run_dir) / SUMMARY_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2))
    os.replace(tmp, path)
    return path


def summarize_results(
    res: RunResults,
    *,
    slos: str | list[str] | Slos | None = None,
    cost_per_hour_usd: CostArg = None,
    saturation_lag_ms: float | None = None,
) -> dict[str, Any]:
    """``summarize`` for an already loaded run."""
    info = res.info
    slo_set = parse_slos(info.get("slos") if slos is None else slos)
    percentiles = tuple(sorted({*PERCENTILES, *slo_set.percentiles}))
    targets = _targets(info, res.records, cost_per_hour_usd)
    ctx = _Context(
        hists=res.histograms(),
        measured=res.measured(),
        finished=res.finished_in_window(),
        window_s=res.window.length_s,
        slos=slo_set,
        percentiles=percentiles,
    )
    notes = list(res.notes)
    out: dict[str, Any] = {
        "schema_version": SUMMARY_SCHEMA_VERSION,
        "results_schema_version": info.get("schema_version", SCHEMA_VERSION),
        "run_id": res.run_id,
        "status": res.status,
        "partial": res.partial,
        "partial_reason": res.partial_reason,
        "notes": notes,
        "mode": info.get("mode")
        or ("closed-loop" if (info.get("arrival") or {}).get("concurrency") else "open-loop"),
        "arrival": info.get("arrival") or {},
        "seed": info.get("seed"),
        "workload": info.get("workload") or {},
        "num_sessions": info.get("num_sessions"),
        "started_at": info.get("started_at"),
        "ended_at": info.get("ended_at"),
        "window": {
            "start_s": res.window.start_s,
            "end_s": _r(res.window.end_s),
            "length_s": _r(res.window.length_s),
            "end_source": res.window.end_source,
            "warmup_s": res.warmup_s,
        },
        "histogram_source": res.histogram_source,
        "slos": slo_set.texts(),
        "targets": [{k: v for k, v in t.items() if k != "_tag"} for t in targets],
    }
    total_cost = _sum_costs(targets)
    out.update(ctx.group(lambda r: True, lambda tc, tn, tg: True, total_cost))
    out["generator"] = _generator(
        info,
        out["metrics"]["schedule_lag"],
        saturation_lag_ms,
        (out["metrics"].get("itl") or {}).get("p50"),
        ctx.measured,
    )
    out["generator_saturated"] = out["generator"]["saturated"]
    exact = (info.get("tokenizer") or {}).get("kind") == "huggingface"
    out["output_tokens_source"] = {
        "usage": sum(1 for r in ctx.measured if r.usage_completion_tokens is not None),
        # Without usage, a reply is counted by an exact tokenizer when the run has one, else by chunks.
        ("tokenizer" if exact else "chunks"): sum(1 for r in ctx.measured if r.usage_completion_tokens is None and r.ok),
    }
    out["tokenizer"] = info.get("tokenizer") or {"name": "builtin", "kind": "approximate"}
    out["prompt_tokens_check"] = prompt_tokens_check(ctx.measured, info.get("tokenizer"))
    out["usage_check"] = usage_check(ctx.measured)
    if (line := usage_note(out["usage_check"])) is not None:
        notes.append(line)
    unknown_in = sum(1 for r in ctx.finished if r.ok and r.prompt_tokens is None)
    if unknown_in:
        notes.append(f"{unknown_in} request(s) have no prompt token count; input tokens/s undercounts")
    notes.extend(generator_health.generator_notes(out["generator"]))
    out["by_turn_class"] = {
        tc: ctx.label_group("turn_class", tc)
        for tc in _labels({r.turn_class for r in res.records}, ctx.hists, 1, TURN_CLASSES)
    }
    out["ttft_split"] = ttft_split(ctx.measured, percentiles=percentiles)
    out["sessions"] = _sessions(ctx.measured, res.records, percentiles)
    out["by_step_kind"] = {
        kind: {
            "requests": st.requests,
            "errors": st.errors,
            "metrics": {m: distribution(h, percentiles=percentiles) for m, h in st.histograms.items()},
        }
        for kind, st in step_kind_stats(ctx.measured).items()
    }
    tenants = _labels({r.tenant for r in res.records}, ctx.hists, 2)
    out["by_tenant"] = {tn: ctx.label_group("tenant", tn) for tn in tenants}
    out["by_target"] = {t["label"]: ctx.target_group([t]) for t in targets}
    for label_key in ("model", "hardware"):
        values = sorted({t["labels"][label_key] for t in targets if t["labels"].get(label_key)})
        out[f"by_{label_key}"] = {
            v: ctx.target_group([t for t in targets if t["labels"].get(label_key) == v]) for v in values
        }
    _add_energy(out, res, notes)
    return out


def _add_energy(out: dict[str, Any], res: RunResults, notes: list[str]) -> None:
    """``energy`` of the run and of each target its GPU power was tied to (``--power-metrics``,
    analysis/energy.py); None without power samples."""
    from analysis.energy import run_energy

    by_target = out["by_target"]
    tokens = {label: g["throughput"]["output_tokens"] for label, g in by_target.items()}
    window = (res.window.start_s, res.window.end_s)
    e = run_energy(res.path, res.info.get("t0_unix_s"), window, out["throughput"]["output_tokens"], tokens)
    out["energy"] = None if e is None else e.total
    for label, g in by_target.items():
        g["energy"] = None if e is None else e.by_target.get(label)
    if e is not None:
        notes.extend(e.notes)
        for target in sorted(set(e.by_target) - set(by_target)):
            notes.append(f"energy: --power-metrics {target}=...: no target of the run is labelled {target!r} "
                         f"(targets: {', '.join(by_target) or 'none'}); its energy counts in the total only")  # fmt: skip


class _Context:
    """What every group is computed from: the run's histograms, records, window and SLOs."""

    def __init__(self, *, hists, measured, finished, window_s, slos, percentiles) -> None:
        self.hists: dict[str, HdrHistogram] = hists
        self.parsed = {tag: parse_histogram_tag(tag) for tag in hists}
        self.measured: list[RequestRecord] = measured
        self.finished: list[RequestRecord] = finished
        self.window_s: float = window_s
        self.slos: Slos = slos
        self.percentiles = percentiles

    def label_group(self, field: str, value: str) -> dict[str, Any]:
        """The group of one turn class or tenant (cost is not attributable to either)."""
        part = 1 if field == "turn_class" else 2
        in_tag = tag_label(value)
        return self.group(
            lambda r: getattr(r, field) == value, lambda *labels: labels[part - 1] == in_tag, None
        )

    def target_group(self, targets: list[dict[str, Any]]) -> dict[str, Any]:
        labels = {t["label"] for t in targets}
        tags = {t["_tag"] for t in targets}
        return self.group(lambda r: r.target in labels, lambda c, tn, tg: tg in tags, _sum_costs(targets))

    def group(
        self,
        rec_pred: Callable[[RequestRecord], bool],
        tag_pred: Callable[[str, str, str], bool],
        cost_per_hour_usd: float | None,
    ) -> dict[str, Any]:
        measured = [r for r in self.measured if rec_pred(r)]
        finished = [r for r in self.finished if rec_pred(r)]
        merged: dict[str, HdrHistogram] = {}
        for tag, (metric, tc, tn, tg) in self.parsed.items():
            if tag_pred(tc, tn, tg):
                h = merged.get(metric)
                if h is None:
                    h = merged[metric] = hlog.new_histogram()
                h.add(self.hists[tag])
        metrics = {
            m: distribution(
                merged.get(m),
                unit="tokens" if m == "tokens_per_chunk" else "ms",
                percentiles=self.percentiles,
            )
            for m in METRICS
        }
        g: dict[str, Any] = {
            "requests": _requests(measured, finished),
            "throughput": _throughput(finished, self.window_s),
            "errors": _errors(measured),
            "metrics": metrics,
        }
        g["slo"] = self._slo(measured, finished, metrics)
        g["cost"] = _cost(
            cost_per_hour_usd, g["throughput"]["output_tokens_per_s"], g["slo"]["goodput_tokens_per_s"]
        )
        return g

    def _slo(self, measured, finished, metrics) -> dict[str, Any]:
        out: dict[str, Any] = {
            "attainment": None,
            "requests_meeting": None,
            "goodput_requests_per_s": None,
            "goodput_tokens_per_s": None,
            "percentile": [],
            "percentile_ok": None,
        }
        if self.slos.per_request and measured:
            # Goodput = how fast requests finish x the share of measured requests that meet the SLOs
            # (tokens: the share of their output tokens). Counting only the good requests that
            # finished inside the window would flatter an overloaded run: its slow requests finish
            # after the window.
            good = [r for r in measured if self.slos.request_meets(r)]
            attainment = len(good) / len(measured)
            ok_tokens = sum(r.output_tokens for r in measured if r.ok)
            token_share = sum(r.output_tokens for r in good) / ok_tokens if ok_tokens else 0.0
            out["requests_meeting"] = len(good)
            out["attainment"] = _r(attainment, 6)
            finished_rate = len(finished) / self.window_s if self.window_s > 0 else None
            ok_token_rate = (
                sum(r.output_tokens for r in finished if r.ok) / self.window_s if self.window_s > 0 else None
            )
            out["goodput_requests_per_s"] = None if finished_rate is None else _r(finished_rate * attainment)
            out["goodput_tokens_per_s"] = None if ok_token_rate is None else _r(ok_token_rate * token_share)
        if self.slos.percentile:
            checks = evaluate_percentile_slos({"metrics": metrics}, self.slos)
            out["percentile"] = [
                {"slo": str(s), "metric": s.metric, "stat": stat_key(s.percentile), "limit_ms": s.limit_ms,
                 "observed_ms": obs, "ok": ok}
                for s, obs, ok in checks
            ]  # fmt: skip
            out["percentile_ok"] = all(c[2] for c in checks)
        return out


def _sessions(
    measured: list[RequestRecord], records: list[RequestRecord], percentiles: tuple[float, ...]
) -> dict[str, Any]:
    """Task time and agent overhead over the complete, fully measured sessions (analysis.sessions)."""
    st = session_stats(measured, records)
    return {
        "measured": st.measured,
        "complete": st.complete,
        "task_time": distribution(st.task_time, percentiles=percentiles),
        "agent_overhead": distribution(st.agent_overhead, percentiles=percentiles),
        "agent_overhead_share": st.agent_overhead_share,
    }


def _requests(measured: list[RequestRecord], finished: list[RequestRecord]) -> dict[str, Any]:
    ok = sum(1 for r in measured if r.ok)
    return {
        "measured": len(measured),
        "ok": ok,
        "errors": len(measured) - ok,
        "finished_in_window": len(finished),
        "ok_finished_in_window": sum(1 for r in finished if r.ok),
    }


def _throughput(finished: list[RequestRecord], window_s: float) -> dict[str, Any]:
    ok = [r for r in finished if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens or 0 for r in ok)
    return {
        "window_s": _r(window_s),
        "requests_per_s": _rate(len(ok), window_s),
        "input_tokens_per_s": _rate(in_tokens, window_s),
        "output_tokens_per_s": _rate(out_tokens, window_s),
        "input_tokens": in_tokens,
        "output_tokens": out_tokens,
    }


def _errors(measured: list[RequestRecord]) -> dict[str, Any]:
    by: dict[str, int] = {}
    for r in measured:
        if not r.ok:
            cat = r.error_category or "unknown"
            by[cat] = by.get(cat, 0) + 1
    order = {c: i for i, c in enumerate(ERROR_CATEGORIES)}
    total = sum(by.values())
    client = sum(n for c, n in by.items() if c in CLIENT_ERROR_CATEGORIES)
    generator = sum(n for c, n in by.items() if c in GENERATOR_ERROR_CATEGORIES)
    cut = by.get(CUT_AT_STOP, 0)
    return {
        "total": total,
        "rate": _r(total / len(measured), 6) if measured else None,
        "by_category": dict(sorted(by.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0]))),
        "server_faults": total - client - generator - cut,
        "client_errors": client,
        # The generator's own network failed (the request never left): not the server's fault.
        "generator_network": generator,
        # Still on the wire when the stop's drain deadline passed: outcome unknown.
        "cut_at_stop": cut,
        # Not failures: 429s the server asked to be retried later (Retry-After), and were.
        "throttled_retries": sum(r.throttled for r in measured),
    }


def _cost(
    cost_per_hour: float | None, out_tps: float | None, goodput_tps: float | None
) -> dict[str, Any] | None:
    """tokens/sec/dollar = output tokens/s ÷ (cost per hour / 3600): output tokens per dollar."""
    if not cost_per_hour or out_tps is None:
        return None
    usd_per_s = cost_per_hour / 3600.0
    return {
        "cost_per_hour_usd": cost_per_hour,
        "output_tokens_per_usd": _r(out_tps / usd_per_s),
        "usd_per_1m_output_tokens": _r(usd_per_s / out_tps * 1e6, 6) if out_tps > 0 else None,
        "goodput_tokens_per_usd": None if goodput_tps is None else _r(goodput_tps / usd_per_s),
    }


def _generator(
    info: dict[str, Any],
    lag: dict[str, Any],
    bound_ms: float | None,
    itl_p50_ms: float | None = None,
    measured: list[RequestRecord] | None = None,
) -> dict[str, Any]:
    """The ``generator`` section: run.json's figures, each lag signal against its bound, whether the
    generator kept up, and if not, the measured cause (analysis/generator_health.py)."""
    us = info.get("max_schedule_lag_us")
    b = generator_health.bounds(
        explicit_ms=bound_ms,
        run_bound_ms=us / 1000.0 if us else None,
        run_explicit=info.get("max_schedule_lag_explicit"),
        arrival_gap_mean_ms=generator_health.mean_arrival_gap_ms([r.t_sched_us for r in measured or ()]),
        itl_p50_ms=itl_p50_ms,
    )
    p99 = lag.get("p99")
    gen = dict(info.get("generator") or {})
    # Any of the generator's own signals over its bound: its schedule lag, and (when the workers
    # measured them, loadgen/engine/health.py) its event-loop lag and its receive-to-parse delay. A chunk
    # read late keeps its kernel stamp, so the reading delays only cost accuracy once a stream's
    # next chunk arrives before the last was read: their bound follows the typical ITL.
    signals = [f"schedule-lag p99 {p99} ms"] if p99 is not None and p99 > b.schedule_ms else []
    for key, name, limit in (
        ("loop_lag_ms", "event-loop-lag", b.loop_ms),
        ("recv_delay_ms", "receive-delay", b.recv_ms),
    ):
        fig = gen.get(key) or {}
        if fig.get("p99") is not None and fig["p99"] > limit:
            why = f" (over ITL p50 {limit:g} ms)" if b.from_itl(limit) else ""
            signals.append(f"{name} p99 {fig['p99']} ms{why}")
    gen.update(generator_health.coalescing(gen.get("coalescing"), measured))
    if b.source == "rule":  # chunks read so late that they shared a recv, the generator measured busy
        coalesced = generator_health.coalesced_signal(gen, itl_p50_ms)
        signals += [coalesced] if coalesced else []
    gen.update(
        schedule_lag_p99_ms=p99, saturation_bound_ms=b.schedule_ms, recv_delay_bound_ms=b.recv_ms,
        loop_lag_bound_ms=b.loop_ms, bound=b.to_dict(), saturated=bool(signals), saturated_by=signals,
    )  # fmt: skip
    gen.update(generator_health.decide_cause(gen, gen["saturated"]))
    return gen


def _targets(info: dict[str, Any], records: list[RequestRecord], cost: CostArg) -> list[dict[str, Any]]:
    out = []
    seen = set()
    for t in info.get("targets") or []:
        label = str(t.get("label") or t.get("url") or "target")
        seen.add(label)
        out.append({**t, "label": label, "labels": dict(t.get("labels") or {})})
    for label in sorted({r.target for r in records} - seen):
        out.append({"label": label, "labels": {}})
    for t in out:
        if isinstance(cost, Mapping):
            t["cost_per_hour_usd"] = cost.get(t["label"], t.get("cost_per_hour_usd"))
        elif cost is not None:
            t["cost_per_hour_usd"] = float(cost)
        t["_tag"] = tag_label(t["label"])
    return out


def _sum_costs(targets: list[dict[str, Any]]) -> float | None:
    costs = [t.get("cost_per_hour_usd") for t in targets]
    return float(sum(costs)) if costs and all(c for c in costs) else None


def _labels(
    from_records: set[str], hists: dict[str, HdrHistogram], part: int, order: tuple[str, ...] = ()
) -> list[str]:
    """Label values seen in records, plus any only the histogram tags know (a run whose records were lost)."""
    cleaned = {tag_label(v) for v in from_records}
    found = from_records | ({parse_histogram_tag(t)[part] for t in hists} - cleaned)
    return [v for v in order if v in found] + sorted(found - set(order))


def _rate(n: float, window_s: float) -> float | None:
    return _r(n / window_s) if window_s > 0 else None


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(float(x), nd)


__all__ = [
    "PERCENTILES",
    "SUMMARY_SCHEMA_VERSION",
    "distribution",
    "format_summary",
    "summarize",
    "summarize_results",
    "summary_to_csv",
    "write_summary",
]
