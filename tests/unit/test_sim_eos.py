"""Where a reply ends (targets/sim/eos.py): a drawn length, seeded by the prompt, capped by max_tokens."""

from __future__ import annotations

import pytest

from targets.sim.eos import LENGTH, STOP, ReplyEnd, reply_end
from targets.sim.profile import ProfileError, load_profile, profile_from_dict
from workloads.distributions import parse_distribution

DIST = parse_distribution(
    {"dist": "lognormal", "median": 20, "sigma": 1.0}, where="t", integer=True, at_least=1
)


def test_no_distribution_or_ignore_eos_runs_to_max_tokens() -> None:
    plain = ReplyEnd(64, LENGTH, None)
    assert reply_end(None, 0, [1, 2, 3], 64, False) == reply_end(DIST, 0, [1, 2, 3], 64, True) == plain


def test_the_drawn_length_is_a_function_of_seed_and_prompt_and_stops_below_max_tokens() -> None:
    ends = [reply_end(DIST, 7, [i, i + 1], 40, False) for i in range(200)]
    assert ends == [reply_end(DIST, 7, [i, i + 1], 40, False) for i in range(200)]  # deterministic
    assert ends != [reply_end(DIST, 8, [i, i + 1], 40, False) for i in range(200)]  # the seed matters
    for e in ends:
        assert e.drawn >= 1
        assert (e.tokens, e.finish_reason) == ((e.drawn, STOP) if e.drawn <= 40 else (40, LENGTH))
    stops = sum(e.finish_reason == STOP for e in ends)
    assert 120 < stops < 200  # P(lognormal(median 20, sigma 1) <= 40) = 0.76


def test_profile_knob_parses_and_refuses_a_bad_one() -> None:
    base = _tiny()
    p = profile_from_dict({**base, "eos_lengths": {"dist": "uniform", "low": 2, "high": 9}})
    assert p.eos_lengths.kind == "uniform" and load_profile("tiny").eos_lengths is None
    with pytest.raises(ProfileError, match=r"^profile: eos_lengths: unknown distribution 'zipf'"):
        profile_from_dict({**base, "eos_lengths": {"dist": "zipf"}})
    with pytest.raises(ProfileError, match="preemption must be true or false"):
        profile_from_dict({**base, "preemption": "yes"})


def _tiny() -> dict:
    from dataclasses import asdict

    return {k: v for k, v in asdict(load_profile("tiny")).items() if k not in ("eos_lengths", "preemption")}
