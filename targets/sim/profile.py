"""Engine profiles: the hardware and model constants the simulated engine runs on.

A profile is a JSON file in ``targets/sim/profiles/`` (one per name). Every number in it has a
source or a derivation in the file's ``"_sources"`` object; ``docs/sim.md`` lists the fields.

Cost model (all times in virtual seconds, see ``docs/sim.md``):

* compute time of ``n`` tokens  = 2 · flop_params · n / (peak_flops_per_s · mfu)
* memory time of one step       = (weight_bytes + kv_bytes_per_token · kv_tokens_read)
                                  / (hbm_bytes_per_s · bandwidth_efficiency)
* one engine step               = step_overhead_s + compute time + memory time

Weight streaming and compute are added, not overlapped: a pessimistic roofline that matches the
calibration targets of the laptop profiles (see their ``_sources``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from targets.sim.tool_calls import ToolCalls, ToolCallsError, parse_tool_calls

if TYPE_CHECKING:
    from workloads.distributions import Distribution


class ProfileError(ValueError):
    """An unknown profile name or a malformed profile file; ``str()`` is a one-line message."""


@dataclass(frozen=True, slots=True)
class Profile:
    """Constants of one simulated engine. Units are in the names; see the module docstring."""

    name: str
    model_name: str
    description: str
    # compute (prefill and the matmul part of decode)
    flop_params: float  # parameters touched per token by matmuls (FLOPs/token = 2 x this)
    peak_flops_per_s: float
    mfu: float  # model FLOPs utilisation reached in prefill, 0 < mfu <= 1
    # memory traffic (decode)
    weight_bytes: float
    hbm_bytes_per_s: float
    bandwidth_efficiency: float  # share of peak bandwidth reached, 0 < e <= 1
    kv_bytes_per_token: float
    # fixed costs
    step_overhead_s: float  # per engine step: scheduling, sampling, kernel launches
    request_overhead_s: float  # per request before it can be scheduled: parsing, tokenising
    # scheduler and cache
    kv_capacity_tokens: int
    block_size_tokens: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_waiting: int
    max_model_len: int
    default_max_tokens: int
    # reasoning (optional in a profile file): each chat, Messages and Responses reply opens with
    # this many reasoning tokens (at most max_tokens - 1, so an answer always follows)
    reasoning_tokens: int = 0
    # natural reply lengths (optional): a distribution in the workload forms; replies end with
    # "stop" at a drawn length below max_tokens (targets/sim/eos.py). None: always max_tokens.
    eos_lengths: Distribution | None = None
    # KV blocks on demand with preemption (optional): False reserves every block a request can
    # need at admission, so nothing is ever preempted; True allocates blocks as tokens need them
    # and preempts the newest running request when one can't be had (vLLM V1, recompute mode).
    preemption: bool = False
    # Tool-call replies (optional): {fraction, tool?}; a reply to a request that offers tools is a
    # call with that probability, its arguments the reply's tokens (targets/sim/tool_calls.py).
    tool_calls: ToolCalls | None = None

    @property
    def num_blocks(self) -> int:
        """KV capacity in whole blocks."""
        return self.kv_capacity_tokens // self.block_size_tokens

    def compute_s(self, tokens: int) -> float:
        """Matmul time of ``tokens`` tokens (compute-bound)."""
        return 2.0 * self.flop_params * tokens / (self.peak_flops_per_s * self.mfu)

    def memory_s(self, kv_tokens_read: int) -> float:
        """Time to stream the weights once plus the KV of ``kv_tokens_read`` context tokens."""
        return (self.weight_bytes + self.kv_bytes_per_token * kv_tokens_read) / (
            self.hbm_bytes_per_s * self.bandwidth_efficiency
        )

    def step_s(self, tokens: int, kv_tokens_read: int) -> float:
        """Duration of one engine step computing ``tokens`` tokens over ``kv_tokens_read`` of context."""
        return self.step_overhead_s + self.compute_s(tokens) + self.memory_s(kv_tokens_read)


_NUMERIC_RULES: dict[str, tuple[float, float]] = {
    # field: (lowest allowed, highest allowed); ints are checked as numbers too
    "flop_params": (1.0, math.inf),
    "peak_flops_per_s": (1.0, math.inf),
    "mfu": (1e-6, 1.0),
    "weight_bytes": (0.0, math.inf),
    "hbm_bytes_per_s": (1.0, math.inf),
    "bandwidth_efficiency": (1e-6, 1.0),
    "kv_bytes_per_token": (0.0, math.inf),
    "step_overhead_s": (0.0, 60.0),
    "request_overhead_s": (0.0, 60.0),
    "kv_capacity_tokens": (1.0, math.inf),
    "block_size_tokens": (1.0, 4096.0),
    "max_num_seqs": (1.0, math.inf),
    "max_num_batched_tokens": (1.0, math.inf),
    "max_waiting": (1.0, math.inf),
    "max_model_len": (2.0, math.inf),
    "default_max_tokens": (1.0, math.inf),
    "reasoning_tokens": (0.0, math.inf),
}
_INT_FIELDS = {f.name for f in fields(Profile) if f.type == "int"}
_OPTIONAL_FIELDS = {"reasoning_tokens": 0, "eos_lengths": None, "preemption": False, "tool_calls": None}


def profile_names() -> list[str]:
    """Names of the profiles shipped with the package, sorted."""
    folder = resources.files("targets.sim") / "profiles"
    return sorted(p.name[: -len(".json")] for p in folder.iterdir() if p.name.endswith(".json"))


def is_profile_file(spec: str) -> bool:
    """True when ``spec`` names a profile file (``path/to/x.json``) rather than a shipped profile."""
    return spec.endswith(".json")


def load_profile_file(path: str | Path) -> Profile:
    """A profile written to a file (e.g. one calibrated against a real engine, see calibration.py)."""
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise ProfileError(f"profile file {path}: {e.strerror or e}") from None
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise ProfileError(f"profile file {path}: not JSON ({e})") from None
    if not isinstance(data, dict):
        raise ProfileError(f"profile file {path}: expected a JSON object")
    return profile_from_dict(data, source=str(path))


def resolve_profile(spec: str) -> Profile:
    """A shipped profile by name, or a profile file when ``spec`` ends in ``.json``."""
    return load_profile_file(spec) if is_profile_file(spec) else load_profile(spec)


def load_profile(name: str) -> Profile:
    """The shipped profile ``name``; ``ProfileError`` naming the available ones if there is none."""
    names = profile_names()
    if name not in names:
        raise ProfileError(f"unknown profile {name!r}; choose one of: {', '.join(names)}")
    raw = (resources.files("targets.sim") / "profiles" / f"{name}.json").read_bytes()
    return profile_from_dict(orjson.loads(raw), source=f"profiles/{name}.json")


def profile_from_dict(data: dict, source: str = "profile") -> Profile:
    """Build and validate a ``Profile``; keys starting with ``_`` (notes, sources) are ignored."""
    known = {f.name for f in fields(Profile)}
    values = {k: v for k, v in data.items() if not k.startswith("_")}
    values = {**_OPTIONAL_FIELDS, **values}
    missing = sorted(known - values.keys())
    if missing:
        raise ProfileError(f"{source}: missing field(s) {', '.join(missing)}")
    unknown = sorted(values.keys() - known)
    if unknown:
        raise ProfileError(f"{source}: unknown field(s) {', '.join(unknown)}")
    values["eos_lengths"] = parse_eos_lengths(values["eos_lengths"], source)
    try:
        values["tool_calls"] = parse_tool_calls(values["tool_calls"], source)
    except ToolCallsError as e:
        raise ProfileError(str(e)) from None
    if not isinstance(values["preemption"], bool):
        raise ProfileError(f"{source}: preemption must be true or false (got {values['preemption']!r})")
    for key, (lo, hi) in _NUMERIC_RULES.items():
        v = values[key]
        if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi:
            raise ProfileError(f"{source}: {key} must be a number in [{lo:g}, {hi:g}] (got {v!r})")
        if key in _INT_FIELDS:
            if v != int(v):
                raise ProfileError(f"{source}: {key} must be a whole number (got {v!r})")
            values[key] = int(v)
        else:
            values[key] = float(v)
    profile = Profile(**values)
    if profile.num_blocks * profile.block_size_tokens < profile.max_model_len:
        raise ProfileError(f"{source}: kv_capacity_tokens must hold at least one max_model_len sequence")
    return profile


def parse_eos_lengths(raw: object, source: str) -> Distribution | None:
    """The ``eos_lengths`` knob: a distribution of reply lengths (tokens, at least 1), or None."""
    if raw is None:
        return None
    # Imported here: the workload distributions bring numpy, which a sim without the knob skips.
    from workloads.distributions import Distribution, parse_distribution
    from workloads.errors import WorkloadError

    if isinstance(raw, Distribution):
        return raw
    try:
        return parse_distribution(raw, where=f"{source}: eos_lengths", integer=True, at_least=1)
    except WorkloadError as e:
        raise ProfileError(str(e)) from None
