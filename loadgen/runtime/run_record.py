"""What ``run.json`` says about a run: config, workload, target and its identity, the generator
and the body reader it streamed with.

Pure functions of the run's config (and the target information ``loadgen run`` hands over), so the
runtime only decides *when* to write them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson

from loadgen.config import RunConfig


def target_identity(cfg: RunConfig) -> dict[str, Any]:
    """What the target says about itself; best effort here (``loadgen run`` checks it before load)."""
    try:
        from targets.identity import read_identity
        from targets.tls import tls_context

        tls = None
        if cfg.target_url.startswith("https:"):
            tls = tls_context(cfg.ca_cert, cfg.insecure_tls, ca_pem=cfg.ca_cert_pem)
        # The key as ``loadgen run``'s preflight sends it: a keyed server refuses /v1/models without it.
        api_key = os.environ.get(cfg.api_key_env) if cfg.api_key_env else None
        return read_identity(cfg.target_url, cfg.adapter, timeout_s=3.0, ssl_context=tls, api_key=api_key)
    except Exception as e:
        return {"error": str(e)}


def run_info(cfg: RunConfig, *, role: str, target_info_file: str = "") -> dict[str, Any]:
    """The ``run.json`` fields known when the run starts (docs/results-format.md)."""
    from loadgen.runtime.run_workload import config_workload
    from workloads.streamed import known_fingerprint

    wl = config_workload(cfg)
    target: dict[str, Any] = {
        "label": cfg.target_label,
        "url": cfg.target_url,
        "adapter": cfg.adapter,
        "kind": cfg.target_kind,
        "labels": cfg.target_labels,
        "cost_per_hour_usd": cfg.cost_per_hour_usd,
        "identity": target_identity(cfg),
    }
    warnings = []
    if cfg.target_url.startswith("https:"):
        target["tls"] = {"ca_cert": cfg.ca_cert, "verified": not cfg.insecure_tls}
        if cfg.insecure_tls:
            from targets.tls import INSECURE_WARNING

            warnings.append(INSECURE_WARNING)
    if target_info_file and os.path.exists(target_info_file):
        extra = orjson.loads(Path(target_info_file).read_bytes())
        target.update({k: v for k, v in extra.items() if k != "identity"})
        target["identity"] = {**target["identity"], **extra.get("identity", {})}
    arrival: dict[str, Any] = {"kind": "closed-loop" if cfg.concurrency else cfg.arrival}
    if cfg.concurrency:
        arrival["concurrency"] = cfg.concurrency
    elif cfg.arrival == "trace":
        arrival["source"] = "file" if cfg.trace_path else "workload"
        arrival["time_scale"] = cfg.trace_time_scale
        if cfg.trace_rate_per_s is not None:
            arrival["rate_per_s"] = cfg.trace_rate_per_s
    else:
        arrival["rate_per_s"] = cfg.rate_per_s
        if cfg.arrival == "gamma":
            arrival["burstiness"] = cfg.burstiness
    return {
        "run_id": cfg.run_id,
        "seed": cfg.seed,
        "mode": cfg.mode,
        "arrival": arrival,
        "workload": {
            "name": wl.name,
            "source": cfg.workload,
            "kind": wl.kind,
            # A streamed trace's bytes are hashed during the run (loadgen.runtime.collector fills it in).
            "fingerprint": known_fingerprint(wl),
            **({"options": cfg.workload_options} if cfg.workload_options else {}),
        },
        "tokenizer": wl.tokenizer.describe(),
        "num_sessions": cfg.num_sessions,
        "duration_s": cfg.duration_s,
        "warmup_s": cfg.warmup_s,
        "targets": [target],
        "slos": cfg.slos,
        "max_schedule_lag_us": cfg.max_schedule_lag_us,
        "max_schedule_lag_explicit": cfg.max_schedule_lag_explicit,
        "config": cfg.public_dict(),
        "role": role,
        "workers": [],
        "lost_workers": [],
        "warnings": warnings,
    }


def generator_cpu(states: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Each worker's CPU seconds and share of one core, from the states workers report."""
    workers = {}
    for wid, st in states.items():
        cpu, wall = st.get("cpu_s"), st.get("wall_s")
        if cpu is None or not wall:
            continue
        workers[wid] = {"cpu_s": cpu, "wall_s": wall, "cpu_share": round(cpu / wall, 4)}
    shares = [w["cpu_share"] for w in workers.values()]
    return {"workers": workers, "max_cpu_share": max(shares) if shares else None}


def connections_used(mode: str, states: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """run.json ``connections``: the run's ``--connections``, and over its workers the TCP
    connections their sessions opened and the sessions that took one another had left."""
    counts = [st.get("connections") or {} for st in states.values()]
    return {
        "connections": {
            "mode": mode,
            "opened": sum(int(c.get("opened", 0)) for c in counts),
            "handed_on": sum(int(c.get("handed_on", 0)) for c in counts),
        }
    }


def reader_used(states: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """run.json ``reader``: the body reader every worker streamed replies with ("compiled" or
    "python", each worker's ``http_reply.READER`` in its reported state); "mixed", with
    ``reader_by_worker``, when they differ (a host without a C compiler, or LOADGEN_READER=python
    on some hosts); null when no worker reported."""
    by_worker = {wid: st["reader"] for wid, st in states.items() if st.get("reader")}
    kinds = set(by_worker.values())
    if len(kinds) > 1:
        return {"reader": "mixed", "reader_by_worker": dict(sorted(by_worker.items()))}
    return {"reader": kinds.pop() if kinds else None}
