"""A sim profile fitted to a real engine's measured speed: the sim's prediction for that engine.

The cost model (profile.py) turns on two rates. Two measurements of the real engine fix them:

* prefill: a cold prompt of ``n`` tokens took ``T`` seconds (one engine step)
  ``T   = s0 + 2 F n / C + (W + K n) / B``
* decode: one sequence at a context of ``c`` tokens emitted a token every ``1/D`` seconds
  ``1/D = s0 + 2 F / C + (W + K c) / B``

``F`` (parameters a token passes through), ``W`` (weight bytes) and ``K`` (KV bytes per token)
come from the model, ``s0`` (per-step overhead) is chosen, and the two linear equations give
``1/C`` (effective FLOP/s, with mfu 1) and ``1/B`` (effective bandwidth, with efficiency 1). Only
those products are identifiable, as in the shipped laptop profiles. The engine's scheduler
limits (slots, KV tokens, batch) are copied from how the real engine was started.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson

from targets.sim.profile import Profile, ProfileError, profile_from_dict


@dataclass(frozen=True)
class EngineMeasurement:
    """What probes of a real engine replica measured (the engine's own timings)."""

    prompt_tokens: int  # n: tokens of the cold prompt
    prefill_s: float  # T: the engine's time for them
    decode_context_tokens: int  # c: context while decoding (prompt + half the reply)
    decode_tokens_per_s: float  # D: one sequence's decode rate
    request_overhead_s: float  # client TTFT less the engine's prefill: HTTP, template, tokenising

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.prefill_s


@dataclass(frozen=True)
class EngineShape:
    """The model's constants and the real engine's scheduler settings."""

    model_name: str
    flop_params: float  # parameters touched per token by matmuls (embedding lookups excluded)
    weight_bytes: float
    kv_bytes_per_token: float
    slots: int  # concurrent sequences (llama-server --parallel)
    kv_capacity_tokens: int  # KV tokens of the replica (llama-server --ctx-size)
    max_model_len: int  # tokens per sequence (llama-server: ctx-size / parallel)
    max_num_batched_tokens: int = 2048  # tokens per step (llama-server -b)
    step_overhead_s: float = 0.0005  # s0: not identifiable from two rates; chosen small


def fit_profile(name: str, m: EngineMeasurement, shape: EngineShape, *, description: str = "") -> dict[str, Any]:
    """A profile (as the dict a profile file holds, validated) that reproduces ``m`` on ``shape``."""
    if m.prompt_tokens < 2 or m.prefill_s <= 0 or m.decode_tokens_per_s <= 0:
        raise ProfileError(f"calibration: measurement out of range ({m})")
    s0, f2 = shape.step_overhead_s, 2.0 * shape.flop_params
    a1, b1, r1 = f2 * m.prompt_tokens, shape.weight_bytes + shape.kv_bytes_per_token * m.prompt_tokens, m.prefill_s - s0
    a2, b2 = f2, shape.weight_bytes + shape.kv_bytes_per_token * m.decode_context_tokens
    r2 = 1.0 / m.decode_tokens_per_s - s0
    det = a1 * b2 - a2 * b1
    inv_flops = (r1 * b2 - r2 * b1) / det if det else -1.0
    inv_bw = (a1 * r2 - a2 * r1) / det if det else -1.0
    if inv_flops <= 0 or inv_bw <= 0:
        # Decode per token cheaper than prefill per token, or a prefill shorter than one decode
        # step: no engine behaves so; the probe was disturbed.
        raise ProfileError(
            f"calibration: prefill {m.prefill_tokens_per_s:.0f} tokens/s and decode {m.decode_tokens_per_s:.0f} "
            "tokens/s fit no compute/bandwidth split; measure again on a quieter machine"
        )
    data: dict[str, Any] = {
        "name": name,
        "model_name": shape.model_name,
        "description": description or f"{shape.model_name} fitted to measured prefill and decode rates",
        "flop_params": float(shape.flop_params),
        "peak_flops_per_s": 1.0 / inv_flops,
        "mfu": 1.0,
        "weight_bytes": float(shape.weight_bytes),
        "hbm_bytes_per_s": 1.0 / inv_bw,
        "bandwidth_efficiency": 1.0,
        "kv_bytes_per_token": float(shape.kv_bytes_per_token),
        "step_overhead_s": s0,
        "request_overhead_s": max(0.0, m.request_overhead_s),
        "kv_capacity_tokens": shape.kv_capacity_tokens,
        "block_size_tokens": 16,
        "max_num_seqs": shape.slots,
        "max_num_batched_tokens": shape.max_num_batched_tokens,
        "max_waiting": 1024,
        "max_model_len": shape.max_model_len,
        "default_max_tokens": 256,
        "_sources": {
            "measurement": asdict(m),
            "shape": asdict(shape),
            "fit": "peak_flops_per_s and hbm_bytes_per_s solve the prefill and decode equations of "
            "targets/sim/calibration.py exactly (mfu and bandwidth_efficiency stay 1); max_waiting is "
            "the sim's admission bound, set high because llama-server queues without one",
        },
    }
    profile_from_dict(data, source=f"calibrated profile {name}")
    return data


def predicted_rates(profile: Profile, m: EngineMeasurement) -> tuple[float, float]:
    """(prefill s, decode tokens/s) the profile gives for the measured prompt and context."""
    prefill = profile.step_s(m.prompt_tokens, m.prompt_tokens)
    decode = 1.0 / profile.step_s(1, m.decode_context_tokens)
    return prefill, decode


def write_profile(path: Path, data: dict[str, Any]) -> Path:
    """Write a profile file that ``--profile path.json`` loads."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2))
    return path
