"""The sim's modelled GPU power, served at ``/dcgm/metrics`` in NVIDIA dcgm-exporter's names.

A page of its own, as a dcgm-exporter beside the engine serves one: the engine's ``/metrics``
keeps the sim's and vLLM's names only.

Power follows the engine's utilisation: the GPU is busy while an engine step runs and idle
between steps, so at any moment the power is ``idle_w`` or ``busy_w``, and over an interval

    power = idle_w + (busy_w - idle_w) x utilisation,    utilisation = busy time / interval.

The energy counter is that integral, exact: ``idle_w x elapsed + (busy_w - idle_w) x busy time``,
with the busy time the sum of the steps' wall durations (virtual seconds x time scale), the step
still running clipped at the moment of the scrape. At time scale 0 the engine takes no wall time,
so the sim draws its idle power only. Exported (docs/sim.md): ``DCGM_FI_DEV_POWER_USAGE`` (gauge, W,
the power at the scrape) and ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` (counter, mJ since the sim
started), one GPU per sim.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from targets.sim.engine import Engine

# (idle W, busy W) per profile; the rest take DEFAULT_WATTS.
WATTS: dict[str, tuple[float, float]] = {
    # H200 SXM: 700 W board power limit (NVIDIA H200 datasheet) at full load; ~75 W idle with the
    # model loaded (typical nvidia-smi idle draw of a Hopper SXM board, estimate).
    "h200-llama3-8b-fp8": (75.0, 700.0),
    # A laptop GPU/SoC: ~45 W under sustained inference, ~5 W idle (estimate).
    "laptop-qwen2.5-1.5b-f16": (5.0, 45.0),
    "laptop-qwen2.5-1.5b-q4": (5.0, 45.0),
}
DEFAULT_WATTS = (75.0, 700.0)


@dataclass(frozen=True, slots=True)
class GpuPower:
    """What one scrape exports: the power now (W) and the energy since the sim started (J)."""

    power_w: float
    energy_j: float
    uuid: str
    model_name: str = "NVIDIA H200 (simulated)"


def watts_of(profile_name: str) -> tuple[float, float]:
    return WATTS.get(profile_name, DEFAULT_WATTS)


def busy_wall_s(engine: Engine, virtual_now_s: float, time_scale: float) -> float:
    """Wall seconds the engine has spent in steps up to ``virtual_now_s`` (the running step clipped)."""
    busy = engine.stats.busy_s
    if engine.now > virtual_now_s:  # a step computed ahead is still running in wall time
        busy -= engine.now - max(virtual_now_s, engine.last_step_start_s)
    return max(0.0, busy) * time_scale


def gpu_power(engine: Engine, profile_name: str, elapsed_wall_s: float, virtual_now_s: float, time_scale: float, uuid: str) -> GpuPower:
    """The modelled power and energy ``elapsed_wall_s`` after the sim started (see the module docstring)."""
    idle_w, busy_w = watts_of(profile_name)
    busy = min(busy_wall_s(engine, virtual_now_s, time_scale), elapsed_wall_s)
    energy_j = idle_w * elapsed_wall_s + (busy_w - idle_w) * busy
    running = time_scale > 0 and engine.last_step_start_s <= virtual_now_s < engine.now
    return GpuPower(busy_w if running else idle_w, energy_j, uuid)


def render_dcgm(p: GpuPower, hostname: str) -> list[str]:
    """The two dcgm-exporter families for one GPU, as exposition lines (the ``/dcgm/metrics`` page)."""
    labels = f'gpu="0",UUID="{p.uuid}",device="nvidia0",modelName="{p.model_name}",Hostname="{hostname}"'
    return [
        "# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).",
        "# TYPE DCGM_FI_DEV_POWER_USAGE gauge",
        f"DCGM_FI_DEV_POWER_USAGE{{{labels}}} {p.power_w:.3f}",
        "# HELP DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION Total energy consumption since boot (in mJ).",
        "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter",
        f"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{labels}}} {round(p.energy_j * 1000.0)}",
    ]
