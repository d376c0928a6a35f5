"""Synthetic sessions: determinism per (seed, index), tenant mix, exact token counts, plausible shapes."""

from __future__ import annotations

import statistics
from collections import Counter

import pytest

from workloads import WorkloadError, load_workload, parse_spec
from workloads.synthetic import SyntheticWorkload
from workloads.tokenizer import count_tokens


def _workload(**overrides) -> SyntheticWorkload:
    data = {"name": "t", "turns": 3, "user_tokens": 10, "output_tokens": 8, **overrides}
    return SyntheticWorkload(parse_spec(data), source="<test>")


def test_session_k_is_independent_of_how_many_were_generated():
    wl = load_workload("agentic-coding")
    ten = list(wl.sessions(seed=7, n=10))
    fresh = load_workload("agentic-coding")  # no shared cache
    assert fresh.session(7, 9) == ten[9]
    assert fresh.session(7, 3) == ten[3]
    # a worker that runs only every third session still gets the same ones
    assert [fresh.session(7, k) for k in range(1, 10, 3)] == ten[1::3]
    assert list(fresh.sessions(7, 4, start=6)) == ten[6:]


def test_seed_and_index_change_the_session_and_ids_are_stable():
    wl = load_workload("chat")
    a = wl.session(1, 0)
    assert a.session_id == "s1-000000" and a.index == 0
    assert wl.session(1, 123).session_id == "s1-000123"
    assert wl.session(2, 0) != a
    assert wl.session(1, 1) != a


def test_token_counts_match_the_tokenizer_exactly():
    wl = _workload(
        system_prompt_tokens=37,
        turns={"dist": "uniform", "low": 2, "high": 6},
        user_tokens={"dist": "uniform", "low": 5, "high": 40},
        tool_turn_fraction=0.5,
        tool_output_tokens={"dist": "normal", "mean": 300, "std": 50},
    )
    for k in range(50):
        s = wl.session(3, k)
        assert count_tokens(s.system_prompt) == 37
        for t in s.turns:
            n = count_tokens(t.content)
            if t.role == "tool":
                assert 100 <= n <= 500
            else:
                assert 5 <= n <= 40
    # fixed counts are exact
    s = _workload(user_tokens=123, turns=4).session(0, 0)
    assert [count_tokens(t.content) for t in s.turns] == [123] * 4


def test_turn_structure_follows_the_knobs():
    wl = _workload(
        turns=6,
        first_user_tokens=50,
        user_tokens=10,
        tool_turn_fraction=1.0,
        tool_output_tokens=200,
        think_time="3s",
        tool_time="500ms",
        output_tokens={"dist": "uniform", "low": 4, "high": 6},
    )
    s = wl.session(0, 5)
    assert len(s.turns) == 6
    first, rest = s.turns[0], s.turns[1:]
    assert first.role == "user" and first.think_time_s == 0.0 and count_tokens(first.content) == 50
    assert all(t.role == "tool" and t.think_time_s == 0.5 and count_tokens(t.content) == 200 for t in rest)
    assert all(4 <= t.max_tokens <= 6 for t in s.turns)
    no_tools = _workload(turns=4, think_time="3s").session(0, 0)
    assert [t.role for t in no_tools.turns] == ["user"] * 4
    assert [t.think_time_s for t in no_tools.turns] == [0.0, 3.0, 3.0, 3.0]


def test_tool_turn_fraction_is_respected():
    wl = _workload(turns=11, tool_turn_fraction=0.7, tool_output_tokens=5)
    roles = Counter(t.role for k in range(400) for t in wl.session(1, k).turns[1:])
    assert roles["tool"] / (roles["tool"] + roles["user"]) == pytest.approx(0.7, abs=0.03)


def test_system_prompt_is_shared_per_tenant_and_tenants_follow_weights():
    wl = _workload(
        system_prompt_tokens={"dist": "uniform", "low": 50, "high": 500},
        tenants=[{"name": "a", "weight": 3}, {"name": "b", "weight": 1, "system_prompt_tokens": 80}],
    )
    sessions = [wl.session(5, k) for k in range(2000)]
    by_tenant: dict[str, set[str]] = {}
    for s in sessions:
        by_tenant.setdefault(s.tenant, set()).add(s.system_prompt)
    assert set(by_tenant) == {"a", "b"}
    assert all(len(prompts) == 1 for prompts in by_tenant.values())
    assert by_tenant["a"] != by_tenant["b"]
    assert count_tokens(next(iter(by_tenant["b"]))) == 80
    share_a = sum(s.tenant == "a" for s in sessions) / len(sessions)
    assert share_a == pytest.approx(0.75, abs=0.03)
    # the prompt depends on (seed, tenant) only: a fresh workload and another spec agree
    other = _workload(system_prompt_tokens=80, tenants=[{"name": "b"}])
    assert other.session(5, 0).system_prompt == next(iter(by_tenant["b"]))
    assert other.session(6, 0).system_prompt != next(iter(by_tenant["b"]))


def test_changing_one_knob_keeps_the_others_draws():
    a = _workload(turns=5, user_tokens={"dist": "uniform", "low": 5, "high": 50}, output_tokens=8)
    b = _workload(turns=5, user_tokens={"dist": "uniform", "low": 5, "high": 50}, output_tokens=64)
    for k in range(5):
        sa, sb = a.session(1, k), b.session(1, k)
        assert [t.content for t in sa.turns] == [t.content for t in sb.turns]
        assert {t.max_tokens for t in sb.turns} == {64}


def test_cold_prefill_marks_every_turn():
    s = _workload(cold_prefill=True).session(0, 0)
    assert all(t.cold for t in s.turns)
    assert not any(t.cold for t in _workload().session(0, 0).turns)


def test_bad_seed_or_index():
    wl = _workload()
    with pytest.raises(
        WorkloadError, match=r"^<test>: session index -1 is not allowed; use an integer >= 0$"
    ):
        wl.session(0, -1)
    with pytest.raises(WorkloadError, match=r"^<test>: seed '1' is not allowed; use an integer$"):
        wl.session("1", 0)


@pytest.mark.parametrize(
    ("name", "turns", "system", "input_mean", "output_mean", "think_mean"),
    [
        # name, turns range, system prompt range, mean new tokens per turn, mean max_tokens, mean think s
        ("agentic-coding", (5, 20), (2000, 4000), (500, 2500), (100, 400), (0.5, 3.0)),
        ("chat", (1, 8), (200, 200), (20, 150), (150, 450), (5.0, 30.0)),
        ("long-context", (1, 2), (100, 400), (5000, 25000), (150, 600), (5.0, 20.0)),
        ("demo-agents", (4, 6), (200, 300), (300, 600), (32, 64), (0.2, 1.0)),
        ("tiny", (2, 3), (10, 40), (10, 30), (8, 32), (0.0, 0.1)),
    ],
)
def test_shipped_specs_produce_plausible_sessions(name, turns, system, input_mean, output_mean, think_mean):
    wl = load_workload(name)
    sessions = list(wl.sessions(seed=11, n=150))
    assert all(turns[0] <= len(s.turns) <= turns[1] for s in sessions)
    assert all(system[0] <= count_tokens(s.system_prompt) <= system[1] for s in sessions)
    all_turns = [t for s in sessions for t in s.turns]
    assert input_mean[0] <= statistics.fmean(count_tokens(t.content) for t in all_turns) <= input_mean[1]
    assert output_mean[0] <= statistics.fmean(t.max_tokens for t in all_turns) <= output_mean[1]
    follow_ups = [t.think_time_s for s in sessions for t in s.turns[1:]]
    if follow_ups:
        assert think_mean[0] <= statistics.fmean(follow_ups) <= think_mean[1]
    assert all(t.max_tokens >= 1 and t.content for t in all_turns)


def test_long_context_first_turn_is_8k_to_32k():
    wl = load_workload("long-context")
    firsts = [count_tokens(wl.session(2, k).turns[0].content) for k in range(40)]
    assert min(firsts) >= 8000 and max(firsts) <= 32000


def test_a_session_rng_draws_what_random_random_of_its_seed_draws_and_seeds_only_when_used() -> None:
    import random

    from workloads.workload import session_rng

    lazy, eager = session_rng(3, 17, "output"), random.Random("3:17:output")
    assert lazy._rng is None  # nothing drawn, nothing seeded
    assert [lazy.random(), lazy.choices("abcdef", k=5), lazy.expovariate(2.0)] == [
        eager.random(),
        eager.choices("abcdef", k=5),
        eager.expovariate(2.0),
    ]
