"""Prometheus text exposition of the sim's state, vLLM-like names with the ``sim:`` prefix."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from targets.sim.engine import Engine


@dataclass(slots=True)
class ServerCounters:
    """Counters kept by the HTTP layer (the engine keeps its own in ``EngineStats``)."""

    requests_received: int = 0
    requests_succeeded: int = 0
    requests_rejected: int = 0  # 429 for a full queue (injected 429s are counted as faults)
    requests_failed: int = 0  # 4xx/5xx other than queue-full, cuts, disconnects
    faults_injected: int = 0


# (name, type, help); values are filled by ``render``
_METRICS = (
    ("sim:num_requests_running", "gauge", "Requests in the running batch."),
    ("sim:num_requests_waiting", "gauge", "Requests waiting to be admitted."),
    ("sim:kv_cache_usage_perc", "gauge", "Share of KV blocks held by running requests (0-1)."),
    ("sim:prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache."),
    ("sim:prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache."),
    ("sim:prompt_tokens_total", "counter", "Prompt tokens of admitted requests."),
    ("sim:generation_tokens_total", "counter", "Generated tokens."),
    ("sim:requests_total", "counter", "Generation requests received."),
    ("sim:request_success_total", "counter", "Requests that streamed every token and finished."),
    ("sim:requests_rejected_total", "counter", "Requests answered 429 because the queue was full."),
    ("sim:requests_failed_total", "counter", "Requests that ended in an error, a fault or a disconnect."),
    ("sim:faults_injected_total", "counter", "Requests given an injected fault."),
    ("sim:prefix_cache_evictions_total", "counter", "KV blocks evicted from the prefix cache."),
    ("sim:engine_steps_total", "counter", "Engine steps run."),
)


def render(values: dict[str, float], model_name: str) -> str:
    """Prometheus text format: a HELP and TYPE line and one sample per metric."""
    label = '{model_name="' + model_name.replace("\\", "\\\\").replace('"', '\\"') + '"}'
    lines: list[str] = []
    for name, kind, help_text in _METRICS:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        v = values[name]
        lines.append(f"{name}{label} {v if isinstance(v, float) else int(v)}")
    return "\n".join(lines) + "\n"


def metric_values(engine: Engine, counters: ServerCounters) -> dict[str, float]:
    """Current value of every metric, by name."""
    st = engine.stats
    return {
        "sim:num_requests_running": engine.num_running,
        "sim:num_requests_waiting": engine.num_waiting,
        "sim:kv_cache_usage_perc": engine.cache.usage(),
        "sim:prefix_cache_queries_total": st.prefix_cache_queries,
        "sim:prefix_cache_hits_total": st.prefix_cache_hits,
        "sim:prompt_tokens_total": st.prompt_tokens,
        "sim:generation_tokens_total": st.generation_tokens,
        "sim:requests_total": counters.requests_received,
        "sim:request_success_total": counters.requests_succeeded,
        "sim:requests_rejected_total": counters.requests_rejected,
        "sim:requests_failed_total": counters.requests_failed,
        "sim:faults_injected_total": counters.faults_injected,
        "sim:prefix_cache_evictions_total": engine.cache.evictions,
        "sim:engine_steps_total": st.steps,
    }
