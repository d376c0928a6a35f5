"""Shipped profiles load, validate and say where every constant comes from."""

from __future__ import annotations

from dataclasses import fields

import orjson
import pytest

from targets.sim.faults import FaultConfig, FaultPicker
from targets.sim.profile import Profile, ProfileError, load_profile, profile_from_dict, profile_names

REQUIRED = {"h200-llama3-8b-fp8", "laptop-qwen2.5-1.5b-q4", "laptop-qwen2.5-1.5b-f16", "tiny"}
# behaviour knobs, optional in a profile file: no hardware constant, so no source
BEHAVIOUR_KNOBS = ("reasoning_tokens", "eos_lengths", "preemption", "tool_calls")
CONSTANTS = [
    f.name for f in fields(Profile) if f.name not in ("name", "model_name", "description", *BEHAVIOUR_KNOBS)
]


def test_required_profiles_ship():
    assert set(profile_names()) >= REQUIRED


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_every_constant_has_a_source(name):
    from importlib import resources

    raw = orjson.loads((resources.files("targets.sim") / "profiles" / f"{name}.json").read_bytes())
    sources = raw["_sources"]
    p = load_profile(name)
    assert p.name == name
    if "all" not in sources:
        missing = [c for c in CONSTANTS if c not in sources]
        assert not missing, f"{name}: no source for {missing}"


def test_unknown_profile_lists_the_names():
    with pytest.raises(ProfileError) as e:
        load_profile("nope")
    msg = str(e.value)
    assert "\n" not in msg
    for name in REQUIRED:
        assert name in msg


def test_bad_profile_values_are_one_line_errors():
    base = {f.name: getattr(load_profile("tiny"), f.name) for f in fields(Profile)}
    for key, value in [("mfu", 1.5), ("max_num_seqs", 0), ("block_size_tokens", 2.5), ("weight_bytes", "x")]:
        with pytest.raises(ProfileError, match=key):
            profile_from_dict({**base, key: value})
    with pytest.raises(ProfileError, match="missing"):
        profile_from_dict({k: v for k, v in base.items() if k != "mfu"})
    with pytest.raises(ProfileError, match="unknown"):
        profile_from_dict({**base, "typo": 1})
    with pytest.raises(ProfileError, match="max_model_len"):
        profile_from_dict({**base, "kv_capacity_tokens": 100})


def test_fault_draws_are_seeded_and_respect_probabilities():
    cfg = FaultConfig(http_500=0.1, cut=0.2)
    a = [FaultPicker(cfg, 1).draw() for _ in range(1)]
    picker_a, picker_b = FaultPicker(cfg, 1), FaultPicker(cfg, 1)
    seq_a = [picker_a.draw() for _ in range(2000)]
    assert seq_a == [picker_b.draw() for _ in range(2000)]
    assert a[0] == seq_a[0]
    assert 0.06 < seq_a.count("http_500") / 2000 < 0.14
    assert 0.13 < seq_a.count("cut") / 2000 < 0.23  # 0.9 x 0.2 after http_500 had its draw
    assert set(seq_a) <= {None, "http_500", "cut"}
    assert all(FaultPicker(FaultConfig(stall=1.0), 0).draw() == "stall" for _ in range(5))
    assert FaultPicker(FaultConfig(), 0).draw() is None
    with pytest.raises(ValueError):
        FaultConfig(cut=1.5)
