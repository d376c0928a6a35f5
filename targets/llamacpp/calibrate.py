"""Measure running llama-server replicas and fit a sim profile to them (targets/sim/calibration.py).

Each replica gets one short warm-up request, then a few cold probes: a prompt that starts with a
nonce (so no cache holds any of it), ``cache_prompt: false``, a fixed number of generated tokens.
The server's own ``timings`` give the prefill time and the decode rate; the client's time to the
first token, less the prefill, gives the per-request overhead. All replicas are probed at once,
so the rates are the ones the replicas reach while sharing the machine, as they do under load.
"""

from __future__ import annotations

import http.client
import json
import random
import statistics
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from targets.fleet.procs import FleetError, http_get
from targets.llamacpp.gguf import GGUFError, kv_bytes_per_token, read_metadata
from targets.sim.calibration import EngineMeasurement, EngineShape, fit_profile, write_profile
from workloads.tokenizer import count_tokens, synthetic_text

PROBE_ROUNDS = 3
PROBE_PREDICT = 16


@dataclass(frozen=True)
class Probe:
    """One cold request: the server's timings and the client's time to the first token."""

    prompt_n: int  # the engine's tokens
    sim_n: int  # the same prompt in the shared approximate tokenizer's tokens (the sim's)
    prompt_ms: float
    predicted_n: int
    predicted_ms: float
    ttft_s: float


def probe_prompt(tokens: int, nonce: str) -> str:
    """``tokens`` tokens of the workloads' synthetic text (by the shared approximate tokenizer),
    after a nonce, so no cache has seen any of it."""
    return f"{nonce} {synthetic_text(tokens, random.Random(nonce))}"


def probe_once(url: str, prompt: str, n_predict: int, timeout_s: float) -> Probe:
    """A streamed ``POST /completion`` without prompt caching; the server's timings of it."""
    parts = urlsplit(url)
    body = json.dumps(
        {"prompt": prompt, "n_predict": n_predict, "stream": True, "cache_prompt": False,
         "ignore_eos": True, "temperature": 0.0}
    ).encode()  # fmt: skip
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout_s)
    try:
        t0 = time.perf_counter()
        conn.request("POST", "/completion", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise FleetError(f"probe of {url}/completion answered HTTP {resp.status}: {resp.read(200)!r}")
        ttft_s = None
        timings: dict[str, Any] | None = None
        for raw in resp:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            event = json.loads(line[5:])
            if ttft_s is None and event.get("content"):
                ttft_s = time.perf_counter() - t0
            if event.get("stop"):
                timings = event.get("timings")
                break
    except (OSError, ValueError) as e:
        raise FleetError(f"probe of {url}/completion failed: {e}") from None
    finally:
        conn.close()
    if not timings or ttft_s is None:
        raise FleetError(f"probe of {url}/completion: the stream ended without tokens or timings")
    return Probe(
        prompt_n=int(timings["prompt_n"]),
        sim_n=count_tokens(prompt),
        prompt_ms=float(timings["prompt_ms"]),
        predicted_n=int(timings["predicted_n"]),
        predicted_ms=float(timings["predicted_ms"]),
        ttft_s=ttft_s,
    )


def probe_replica(url: str, prompt_tokens: int, rounds: int, timeout_s: float) -> list[Probe]:
    probe_once(url, probe_prompt(20, uuid.uuid4().hex), 4, timeout_s)  # warm-up: page the model in
    return [
        probe_once(url, probe_prompt(prompt_tokens, uuid.uuid4().hex), PROBE_PREDICT, timeout_s)
        for _ in range(rounds)
    ]


def measure(
    urls: list[str], *, prompt_tokens: int = 150, rounds: int = PROBE_ROUNDS, timeout_s: float = 60.0
) -> tuple[EngineMeasurement, list[Probe]]:
    """Probe every replica at once; the medians over all probes as one measurement.

    Prompt sizes are counted in the sim's tokens: a workload prompt of N of them is N to the sim
    and ``prompt_n`` to the engine, so the sim must spend the engine's time on N.
    """
    with ThreadPoolExecutor(len(urls)) as pool:
        probes = [p for ps in pool.map(lambda u: probe_replica(u, prompt_tokens, rounds, timeout_s), urls) for p in ps]
    n = round(statistics.median(p.sim_n for p in probes))
    per_token_s = statistics.median(p.prompt_ms / 1000.0 / p.sim_n for p in probes)
    decode = statistics.median((p.predicted_n - 1) / (p.predicted_ms / 1000.0) for p in probes if p.predicted_n > 1)
    overhead = statistics.median(p.ttft_s - p.prompt_ms / 1000.0 for p in probes)
    m = EngineMeasurement(
        prompt_tokens=n,
        prefill_s=per_token_s * n,
        decode_context_tokens=n + PROBE_PREDICT // 2,
        decode_tokens_per_s=decode,
        request_overhead_s=max(0.0, overhead),
    )
    return m, probes


def model_shape(url: str, model_path: Path, *, parallel: int, ctx: int) -> EngineShape:
    """The served model's constants: sizes from ``/v1/models`` meta, attention shape from the GGUF."""
    status, body = http_get(f"{url}/v1/models", 5.0)
    if status != 200:
        raise FleetError(f"GET {url}/v1/models answered HTTP {status}")
    entry = (json.loads(body).get("data") or [{}])[0]
    meta = entry.get("meta") or {}
    try:
        n_params, size = float(meta["n_params"]), float(meta["size"])
        embedding = float(meta["n_vocab"]) * float(meta["n_embd"])
    except (KeyError, TypeError, ValueError):
        raise FleetError(f"GET {url}/v1/models has no model meta (n_params, size, n_vocab, n_embd)") from None
    return EngineShape(
        model_name=Path(str(entry.get("id", "model"))).name,
        # The (tied) embedding is a lookup on input; llama.cpp multiplies by it only for the
        # positions whose logits it needs.
        flop_params=n_params - embedding,
        weight_bytes=size,
        kv_bytes_per_token=_kv_bytes_per_token(model_path),
        slots=parallel,
        kv_capacity_tokens=ctx,
        max_model_len=ctx // parallel,
    )


def _kv_bytes_per_token(model_path: Path) -> float:
    try:
        return kv_bytes_per_token(read_metadata(model_path))
    except GGUFError as e:
        raise FleetError(f"cannot read the KV shape of {model_path}: {e}") from None


def calibrated_profile(
    out: Path, name: str, *, urls: list[str], model_path: Path, parallel: int, ctx: int, prompt_tokens: int = 150
) -> tuple[Path, EngineMeasurement]:
    """Measure the replicas at ``urls`` (serving ``model_path``), fit a profile, write it to ``out``."""
    shape = model_shape(urls[0], model_path, parallel=parallel, ctx=ctx)
    m, probes = measure(urls, prompt_tokens=prompt_tokens)
    data = fit_profile(
        name, m, shape,
        description=f"{shape.model_name} in llama-server on this machine ({len(urls)} replicas probed at once, "
        f"--parallel {parallel}, --ctx-size {ctx}): prefill {m.prefill_tokens_per_s:.0f} tokens/s, "
        f"decode {m.decode_tokens_per_s:.0f} tokens/s",
    )  # fmt: skip
    data["_sources"]["probes"] = [p.__dict__ for p in probes]
    return write_profile(out, data), m


def calibrate_fresh_replicas(
    out: Path, name: str, *, replicas: int, parallel: int, ctx: int, ready_timeout_s: float = 60.0
) -> tuple[Path, EngineMeasurement]:
    """Start ``replicas`` llama-server replicas as the fleet does (cached binary and model, cores //
    replicas threads each), measure them, write the fitted profile to ``out``, stop them."""
    from targets.llamacpp.launcher import ensure_llama_server, start_llama_servers

    binary, model = ensure_llama_server(build=False)
    with start_llama_servers(
        replicas, binary=binary, model_path=model, parallel=parallel, ctx=ctx, ready_timeout=ready_timeout_s
    ) as servers:
        return calibrated_profile(
            out, name, urls=servers.urls, model_path=model, parallel=parallel, ctx=ctx
        )
