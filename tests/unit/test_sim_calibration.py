"""A sim profile fitted to measured engine rates reproduces them, and loads from a file."""

from __future__ import annotations

import pytest

from targets.fleet import start_fleet
from targets.fleet.procs import FleetError
from targets.sim.calibration import (
    EngineMeasurement,
    EngineShape,
    fit_profile,
    predicted_rates,
    write_profile,
)
from targets.sim.engine import Arrival, Engine, simulate
from targets.sim.profile import ProfileError, load_profile_file, profile_from_dict, resolve_profile

# SmolLM2-135M in llama-server on one CPU thread, as probed on the development machine.
SHAPE = EngineShape(
    model_name="SmolLM2-135M-Instruct.Q4_1.gguf",
    flop_params=106_203_456,
    weight_bytes=96_576_768,
    kv_bytes_per_token=23_040,
    slots=4,
    kv_capacity_tokens=4096,
    max_model_len=1024,
)
MEASURED = EngineMeasurement(
    prompt_tokens=154, prefill_s=2.2, decode_context_tokens=162, decode_tokens_per_s=21.0, request_overhead_s=0.012
)


def test_the_fitted_profile_reproduces_the_measured_rates() -> None:
    data = fit_profile("fitted", MEASURED, SHAPE)
    profile = profile_from_dict(data)
    prefill_s, decode = predicted_rates(profile, MEASURED)
    assert prefill_s == pytest.approx(MEASURED.prefill_s, rel=1e-9)
    assert decode == pytest.approx(MEASURED.decode_tokens_per_s, rel=1e-9)
    assert (profile.max_num_seqs, profile.kv_capacity_tokens, profile.max_model_len) == (4, 4096, 1024)
    assert profile.request_overhead_s == pytest.approx(0.012)
    assert data["_sources"]["measurement"]["prefill_s"] == 2.2


def test_the_engine_runs_the_fitted_profile_at_the_measured_speed() -> None:
    # One cold request through the scheduler itself: its first token after overhead + prefill,
    # then one token per decode step at about the measured rate.
    profile = profile_from_dict(fit_profile("fitted", MEASURED, SHAPE))
    seq = simulate(Engine(profile), [Arrival(0.0, "r", list(range(MEASURED.prompt_tokens)), 17)])["r"]
    assert seq.first_token_s == pytest.approx(MEASURED.request_overhead_s + MEASURED.prefill_s, rel=0.01)
    gaps = (seq.token_times_s[-1] - seq.token_times_s[0]) / (len(seq.token_times_s) - 1)
    assert 1.0 / gaps == pytest.approx(MEASURED.decode_tokens_per_s, rel=0.05)


@pytest.mark.parametrize(
    "change",
    [
        {"decode_tokens_per_s": 1000.0},  # decode per token cheaper than prefill per token
        {"prefill_s": 0.01},  # a whole prefill shorter than one decode step
        {"prompt_tokens": 1},
    ],
)
def test_measurements_no_engine_could_give_are_refused(change: dict) -> None:
    m = EngineMeasurement(**{**MEASURED.__dict__, **change})
    with pytest.raises(ProfileError, match=r"^calibration: "):
        fit_profile("fitted", m, SHAPE)


def test_a_profile_file_loads_by_path(tmp_path) -> None:
    path = write_profile(tmp_path / "sub" / "fitted.json", fit_profile("fitted", MEASURED, SHAPE))
    assert load_profile_file(path).name == "fitted"
    assert resolve_profile(str(path)) == load_profile_file(path)
    assert resolve_profile("tiny").name == "tiny"
    (tmp_path / "bad.json").write_text("[1]")
    with pytest.raises(ProfileError, match="expected a JSON object"):
        resolve_profile(str(tmp_path / "bad.json"))
    with pytest.raises(ProfileError, match=r"missing\.json"):
        resolve_profile(str(tmp_path / "missing.json"))


def test_a_fleet_refuses_a_bad_profile_file_before_starting(tmp_path) -> None:
    (tmp_path / "p.json").write_text('{"name": "x"}')
    with pytest.raises(FleetError, match="missing field"):
        start_fleet(replicas=1, profile=str(tmp_path / "p.json"), router="none")
