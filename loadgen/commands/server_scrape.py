"""Server-side metrics around a run: each engine's and router's ``/metrics``, before and after.

The raw Prometheus pages are kept (``server-metrics/<name>-before.prom``, ``-after.prom``) so any
metric can be looked at later, and ``server-metrics.json`` holds, per endpoint, the counter
increases over the run and the engine-aware picks of ``targets.scrape`` (prefix-cache hit rate,
mean queue time, queue depth, the engine's mean TTFT, preemptions), read from each engine's own
names: vLLM's ``vllm:*`` (which the sim exports beside its ``sim:*``), SGLang's, llama-server's. A server without ``/metrics`` is noted, never an error: the run's own
numbers do not depend on it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

SERVER_METRICS_DIR = "server-metrics"
SERVER_METRICS_FILE = "server-metrics.json"


def endpoints(url: str, target_info: dict[str, Any]) -> dict[str, str]:
    """name -> metrics URL: the target itself, or every replica and the router of a fleet."""
    fleet = target_info.get("fleet")
    if not fleet:
        return {"target": f"{url.rstrip('/')}/metrics"}
    out = {}
    for i, replica in enumerate(fleet.get("replicas", [])):
        out[replica.get("server_id") or f"replica-{i}"] = f"{replica['url'].rstrip('/')}/metrics"
    router = fleet.get("router") or {}
    if router.get("prometheus_url"):
        out["router"] = f"{router['prometheus_url'].rstrip('/')}/metrics"
    return out


def snapshot(urls: dict[str, str], timeout_s: float = 3.0) -> dict[str, str | None]:
    """The raw page of each endpoint, or None where it could not be read."""
    from targets.scrape import http_get

    out: dict[str, str | None] = {}
    for name, url in urls.items():
        try:
            status, _, body = http_get(url, timeout_s)
            out[name] = body.decode("utf-8", "replace") if status == 200 else None
        except (OSError, ValueError):
            out[name] = None
    return out


def write(run_dir: Path, urls: dict[str, str], before: dict[str, str | None], after: dict[str, str | None]) -> None:
    from targets.scrape import diff, parse_text, summarize

    raw = run_dir / SERVER_METRICS_DIR
    raw.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {}
    for name, url in urls.items():
        b, a = before.get(name), after.get(name)
        for suffix, text in (("before", b), ("after", a)):
            if text is not None:
                (raw / f"{name}-{suffix}.prom").write_text(text)
        entry: dict[str, Any] = {"url": url}
        if a is None:
            entry["note"] = "no /metrics page could be read"
        else:
            after_m = parse_text(a)
            entry["at_end"] = summarize(after_m)
            if b is not None:
                delta = diff(parse_text(b), after_m)
                entry["during_run"] = summarize(delta)
                entry["counters"] = {
                    s.name + _labels(s.labels): s.value for fam in delta.families.values() for s in fam.samples
                }
        report[name] = entry
    (run_dir / SERVER_METRICS_FILE).write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))


def _labels(labels: Any) -> str:
    items = labels.items() if hasattr(labels, "items") else labels
    inner = ",".join(f'{k}="{v}"' for k, v in items)
    return f"{{{inner}}}" if inner else ""
