"""Prometheus text exposition of the sim's state: its own ``sim:*`` names, and beside them the
``vllm:*`` names a vLLM server exports (vLLM V1), so tools and dashboards built for vLLM read the
sim as they read vLLM. Every sample carries ``model_name``; docs/sim.md lists both families."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise
from typing import TYPE_CHECKING

from targets.sim.histogram import (
    ITL_BUCKETS_S,
    REQUEST_BUCKETS_S,
    TTFT_BUCKETS_S,
    Histogram,
    one_two_five_buckets,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from targets.sim.engine import Engine

# vLLM's request_success_total label values: stop (end of sequence), length (max_tokens), abort
FINISHED_REASONS = ("stop", "length", "abort")


@dataclass(slots=True)
class ServerCounters:
    """Counters kept by the HTTP layer (the engine keeps its own in ``EngineStats``)."""

    requests_received: int = 0
    requests_succeeded: int = 0
    requests_rejected: int = 0  # 429 for a full queue (injected 429s are counted as faults)
    requests_failed: int = 0  # 4xx/5xx other than queue-full, cuts, disconnects
    faults_injected: int = 0
    finished: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FINISHED_REASONS, 0))
    # Latencies of finished requests in wall seconds (see ``observe_finished``)
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS_S))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS_S))
    e2e: Histogram = field(default_factory=lambda: Histogram(REQUEST_BUCKETS_S))
    queue: Histogram = field(default_factory=lambda: Histogram(REQUEST_BUCKETS_S))
    prefill: Histogram = field(default_factory=lambda: Histogram(REQUEST_BUCKETS_S))
    decode: Histogram = field(default_factory=lambda: Histogram(REQUEST_BUCKETS_S))
    inference: Histogram = field(default_factory=lambda: Histogram(REQUEST_BUCKETS_S))
    # Tokens per request (bounds 1, 2, 5, ... up to max_model_len: ``size_buckets``)
    prompt_tokens: Histogram | None = None
    generation_tokens: Histogram | None = None

    def size_buckets(self, max_model_len: int) -> None:
        """Set up the per-request token histograms for a model of ``max_model_len`` tokens."""
        bounds = one_two_five_buckets(max_model_len)
        self.prompt_tokens, self.generation_tokens = Histogram(bounds), Histogram(bounds)

    def observe_finished(
        self,
        finish_reason: str,
        ttft_s: float,
        e2e_s: float,
        engine_s: tuple[float, float, float],
        tokens: tuple[int, int],
        token_times_ns: Sequence[int],
    ) -> None:
        """A request that got every token: its reason, TTFT and end-to-end time, the engine's
        (queue, prefill, decode) seconds, its (prompt, generated) tokens, and one inter-token gap
        per token after the first (tokens written together: a gap of 0)."""
        self.finished[finish_reason] = self.finished.get(finish_reason, 0) + 1
        self.ttft.observe(ttft_s)
        self.e2e.observe(e2e_s)
        queue_s, prefill_s, decode_s = engine_s
        self.queue.observe(queue_s)
        self.prefill.observe(prefill_s)
        self.decode.observe(decode_s)
        self.inference.observe(prefill_s + decode_s)
        if self.prompt_tokens is not None and self.generation_tokens is not None:
            self.prompt_tokens.observe(tokens[0])
            self.generation_tokens.observe(tokens[1])
        if len(token_times_ns) > 1:
            self.itl.observe_all((b - a) / 1e9 for a, b in pairwise(token_times_ns))


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
    ("sim:num_preemptions_total", "counter", "Requests preempted under KV pressure (recompute mode)."),
    ("sim:engine_steps_total", "counter", "Engine steps run."),
)

# vLLM's names for the same state (name, type, help, the sim: metric with the value)
_VLLM_SCALARS = (
    ("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", "sim:num_requests_running"),
    ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", "sim:num_requests_waiting"),
    ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", "sim:kv_cache_usage_perc"),
    ("vllm:gpu_cache_usage_perc", "gauge", "GPU KV-cache usage (the older name of kv_cache_usage_perc).", "sim:kv_cache_usage_perc"),
    ("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", "sim:prompt_tokens_total"),
    ("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.", "sim:generation_tokens_total"),
    ("vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine.", "sim:num_preemptions_total"),
    ("vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in terms of number of queried tokens.", "sim:prefix_cache_queries_total"),
    ("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.", "sim:prefix_cache_hits_total"),
)  # fmt: skip
_VLLM_HISTOGRAMS = (
    ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", "ttft"),
    ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", "itl"),
    ("vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds (the older name of inter_token_latency_seconds).", "itl"),
    ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", "e2e"),
    ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", "queue"),
    ("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", "prefill"),
    ("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", "decode"),
    ("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.", "inference"),
    ("vllm:request_prompt_tokens", "Number of prefill tokens processed.", "prompt_tokens"),
    ("vllm:request_generation_tokens", "Number of generation tokens processed.", "generation_tokens"),
)  # fmt: skip


def _number(v: float) -> str:
    return repr(v) if isinstance(v, float) else str(int(v))


def render(values: dict[str, float], model_name: str, counters: ServerCounters | None = None) -> str:
    """Prometheus text format: HELP and TYPE lines and the samples of every metric, the sim's
    own names first, then (with ``counters``) vLLM's."""
    label = 'model_name="' + model_name.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    lines: list[str] = []
    for name, kind, help_text in _METRICS:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name}{{{label}}} {_number(values[name])}"]
    if counters is not None:
        for name, kind, help_text, source in _VLLM_SCALARS:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name}{{{label}}} {_number(values[source])}"]
        name = "vllm:request_success_total"
        lines += [f"# HELP {name} Count of successfully processed requests.", f"# TYPE {name} counter"]
        for reason, n in counters.finished.items():
            lines.append(f'{name}{{{label},finished_reason="{reason}"}} {n}')
        for name, help_text, attr in _VLLM_HISTOGRAMS:
            hist = getattr(counters, attr)
            if hist is None:
                continue
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
            lines += hist.lines(name, label)
    return "\n".join(lines) + "\n"


def metric_values(engine: Engine, counters: ServerCounters) -> dict[str, float]:
    """Current value of every ``sim:`` metric, by name."""
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
        "sim:num_preemptions_total": st.preemptions,
        "sim:engine_steps_total": st.steps,
    }
