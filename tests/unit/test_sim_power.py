"""The sim's modelled GPU power (targets/sim/power.py): the energy counter is the exact integral of
idle + (busy - idle) x utilisation, and the page reads back through targets/power.py."""

from __future__ import annotations

import pytest

from targets.power import parse_power_page
from targets.sim.engine import Engine
from targets.sim.power import GpuPower, busy_wall_s, gpu_power, render_dcgm, watts_of
from targets.sim.profile import load_profile


def _engine_with_steps(busy_s: float, now_s: float, last_start_s: float) -> Engine:
    e = Engine(load_profile("tiny"))
    e.stats.busy_s, e.now, e.last_step_start_s = busy_s, now_s, last_start_s
    return e


def test_energy_is_idle_power_times_time_plus_the_busy_surplus() -> None:
    idle, busy = watts_of("h200-llama3-8b-fp8")
    e = _engine_with_steps(busy_s=2.0, now_s=3.0, last_start_s=2.5)
    # 4 virtual seconds in at time scale 1: 2 s of steps, all ended
    p = gpu_power(e, "h200-llama3-8b-fp8", 4.0, 4.0, 1.0, "GPU-x")
    assert p.energy_j == pytest.approx(idle * 4.0 + (busy - idle) * 2.0)
    assert p.power_w == idle  # between steps


def test_a_running_step_counts_up_to_the_scrape_at_the_busy_power() -> None:
    # the step [2.5, 3.0) is computed ahead; at 2.7 only 0.2 s of it has run
    e = _engine_with_steps(busy_s=2.0, now_s=3.0, last_start_s=2.5)
    assert busy_wall_s(e, 2.7, 1.0) == pytest.approx(1.7)
    assert busy_wall_s(e, 2.7, 2.0) == pytest.approx(3.4)  # a slower time scale stretches the steps in wall time
    p = gpu_power(e, "h200-llama3-8b-fp8", 2.7, 2.7, 1.0, "GPU-x")
    assert p.power_w == watts_of("h200-llama3-8b-fp8")[1]


def test_at_time_scale_zero_the_sim_draws_idle_power() -> None:
    e = _engine_with_steps(busy_s=5.0, now_s=5.0, last_start_s=4.0)
    idle, _ = watts_of("tiny")
    p = gpu_power(e, "tiny", 2.0, 5.0, 0.0, "GPU-x")
    assert (p.power_w, p.energy_j) == (idle, pytest.approx(idle * 2.0))


def test_the_page_carries_dcgm_names_that_read_back() -> None:
    page = "\n".join(render_dcgm(GpuPower(412.5, 1234.5678, "GPU-sim-1"), "sim-1")) + "\n"
    assert 'DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-sim-1"' in page
    r = parse_power_page(page)
    assert (r.exporter, r.gpus, r.power_w) == ("dcgm", 1, 412.5)
    assert list(r.energy_j_by_gpu.values()) == [pytest.approx(1234.568)]  # whole mJ
