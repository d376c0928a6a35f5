"""Workload specs: loading, shipped specs, strict validation with exact one-line messages."""

from __future__ import annotations

import textwrap

import pytest

import workloads
from workloads import WorkloadError, load_workload, parse_spec, shipped_workloads
from workloads.spec import load_spec

MINIMAL = {"name": "m", "turns": 2, "user_tokens": 10, "output_tokens": 8}


def _message(fn, *args) -> str:
    """The one-line message ``fn(*args)`` raises."""
    with pytest.raises(WorkloadError) as err:
        fn(*args)
    msg = str(err.value)
    assert "\n" not in msg
    return msg


def _write(tmp_path, text, name="w.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def _error(data, where="w.yaml") -> str:
    with pytest.raises(WorkloadError) as err:
        parse_spec(data, where=where)
    msg = str(err.value)
    assert "\n" not in msg
    return msg


def test_exports_are_sorted_and_resolve():
    # ruff's isort-style order (RUF022): CONSTANTS, then Classes, then functions, each alphabetical
    def kind(name: str) -> int:
        return 0 if name.isupper() else 1 if name[0].isupper() else 2

    assert workloads.__all__ == sorted(workloads.__all__, key=lambda n: (kind(n), n))
    for name in workloads.__all__:
        assert getattr(workloads, name) is not None


def test_shipped_specs_are_listed_and_named_after_their_file():
    names = shipped_workloads()
    assert {"agentic-coding", "chat", "long-context", "demo-agents", "tiny"} <= set(names)
    for name in names:
        wl = load_workload(name)
        assert wl.name == name
        assert wl.source == name
        assert wl.num_sessions is None
        assert len(wl.fingerprint()) == 64


def test_unknown_name_lists_the_shipped_ones():
    msg = _message(load_workload, "agentic")
    assert msg == (
        f"unknown workload 'agentic'; use one of {', '.join(shipped_workloads())}, a .yaml/.yml spec, or a data "
        "file (.jsonl session file, ShareGPT .json/.jsonl, Mooncake or Qwen-Bailian .jsonl, Azure or BurstGPT .csv)"
    )


def test_yaml_path_loads_with_durations_and_tenants(tmp_path):
    p = _write(
        tmp_path,
        """
        name: mine
        description: two tenants
        system_prompt_tokens: 100
        turns: {dist: uniform, low: 2, high: 4}
        user_tokens: 20
        output_tokens: 16
        think_time: {dist: exponential, mean: 1500ms, max: 5s}
        tenants:
          - {name: a, weight: 3}
          - {name: b, weight: 1, output_tokens: 64, think_time: 2s, cold_prefill: true}
        """,
        name="mine.yml",
    )
    wl = load_workload(str(p))
    assert wl.name == "mine" and wl.source == str(p)
    assert wl.tenants == ("a", "b")
    a, b = wl.spec.tenants
    assert a.weight == 3 and a.knobs.output_tokens.mean == 16 and not a.knobs.cold_prefill
    assert b.knobs.output_tokens.mean == 64 and b.knobs.think_time.mean == 2.0 and b.knobs.cold_prefill
    assert a.knobs.think_time.to_dict() == {"dist": "exponential", "mean": 1.5, "max": 5}
    # first_user_tokens and tool_time default to user_tokens and think_time
    assert a.knobs.first_user_tokens == a.knobs.user_tokens
    assert b.knobs.tool_time == b.knobs.think_time
    d = wl.to_dict()
    assert d["kind"] == "synthetic" and d["fingerprint"] == wl.fingerprint()
    assert d["spec"]["tenants"][1] == {
        "name": "b",
        "weight": 1,
        "output_tokens": 64,
        "think_time": 2,
        "cold_prefill": True,
    }


def test_fingerprint_tracks_traffic_not_names(tmp_path):
    base = parse_spec(dict(MINIMAL))
    renamed = parse_spec({**MINIMAL, "name": "other", "description": "same traffic"})
    written_differently = parse_spec({**MINIMAL, "turns": {"dist": "fixed", "value": 2.0}})
    changed = parse_spec({**MINIMAL, "output_tokens": 9})
    assert base.fingerprint() == renamed.fingerprint() == written_differently.fingerprint()
    assert base.fingerprint() != changed.fingerprint()
    # a tenant override equal to the top level is the same traffic
    via_tenant = parse_spec(
        {**MINIMAL, "output_tokens": 1, "tenants": [{"name": "default", "output_tokens": 8}]}
    )
    assert via_tenant.fingerprint() == base.fingerprint()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {**MINIMAL, "think_tme": 2},
            "w.yaml: think_tme: unknown key; use one of name, description, system_prompt_tokens, turns, "
            "first_user_tokens, user_tokens, tool_output_tokens, output_tokens, think_time, tool_time, "
            "tool_turn_fraction, cold_prefill, steps, tenants",
        ),
        ({**MINIMAL, "user_tokens": -5}, "w.yaml: user_tokens: -5 is negative; use a number >= 0"),
        ({**MINIMAL, "output_tokens": 0}, "w.yaml: output_tokens: 0 is below 1; use a value >= 1"),
        (
            {**MINIMAL, "think_time": {"dist": "weibull", "k": 2}},
            "w.yaml: think_time: unknown distribution 'weibull'; use one of fixed, uniform, normal, lognormal, "
            "exponential",
        ),
        (
            {k: v for k, v in MINIMAL.items() if k != "turns"},
            "w.yaml: turns: missing; give it at the top level or in every tenant (a spec needs name, turns, "
            "user_tokens, output_tokens)",
        ),
        (
            {k: v for k, v in MINIMAL.items() if k != "name"},
            "w.yaml: name: missing; a spec needs name, turns, user_tokens, output_tokens",
        ),
        (
            {**MINIMAL, "turns": "many"},
            "w.yaml: turns: 'many' is not a number; use an integer or a mapping with dist: one of fixed, "
            "uniform, normal, lognormal, exponential",
        ),
        ({**MINIMAL, "turns": 2.5}, "w.yaml: turns: 2.5 is not a whole number; use an integer"),
        ({**MINIMAL, "cold_prefill": "yes"}, "w.yaml: cold_prefill: 'yes' is not allowed; use true or false"),
        (
            {**MINIMAL, "tool_turn_fraction": 1.5},
            "w.yaml: tool_turn_fraction: 1.5 is not allowed; use a number from 0 to 1",
        ),
        (
            {**MINIMAL, "tool_turn_fraction": 0.5},
            "w.yaml: tool_output_tokens: missing; needed when tool_turn_fraction > 0 (it is 0.5)",
        ),
        (
            {**MINIMAL, "think_time": "soon"},
            "w.yaml: think_time: 'soon' is not a duration; use a number with a unit: us, ms, s, m or h "
            "(e.g. 500ms, 90s, 2m); a bare number is seconds, or a mapping with dist: one of fixed, uniform, "
            "normal, lognormal, exponential",
        ),
        (
            {**MINIMAL, "tenants": [{"name": "a", "colour": "red"}]},
            "w.yaml: tenants[0].colour: unknown key; use one of name, weight, system_prompt_tokens, turns, "
            "first_user_tokens, user_tokens, tool_output_tokens, output_tokens, think_time, tool_time, "
            "tool_turn_fraction, cold_prefill",
        ),
        (
            {**MINIMAL, "tenants": [{"name": "a", "output_tokens": -1}]},
            "w.yaml: tenants[0].output_tokens: -1 is negative; use a number >= 0",
        ),
        (
            {**MINIMAL, "tenants": [{"name": "a", "weight": 0}]},
            "w.yaml: tenants[0].weight: 0 is not allowed; use a number > 0",
        ),
        (
            {**MINIMAL, "tenants": [{"weight": 1}]},
            "w.yaml: tenants[0].name: missing; every tenant needs a name",
        ),
        (
            {**MINIMAL, "tenants": [{"name": "a"}, {"name": "a"}]},
            "w.yaml: tenants[1].name: tenant 'a' appears twice; use unique names",
        ),
        (
            {**MINIMAL, "tenants": []},
            "w.yaml: tenants: [] is not a list of tenants; use a non-empty list of mappings with name, weight "
            "and knob overrides",
        ),
        (
            {**MINIMAL, "tenants": [{"name": "a", "tool_turn_fraction": 0.3}]},
            "w.yaml: tenants[0].tool_output_tokens: missing; needed when tool_turn_fraction > 0 (it is 0.3)",
        ),
        (
            ["a", "list"],
            "w.yaml: the spec must be a mapping of keys (name, turns, user_tokens, output_tokens, ...)",
        ),
    ],
)
def test_validation_messages_are_exact_one_liners(data, message):
    assert _error(data) == message


def test_required_knobs_may_come_from_every_tenant():
    spec = parse_spec(
        {
            "name": "t",
            "user_tokens": 5,
            "output_tokens": 5,
            "tenants": [{"name": "a", "turns": 1}, {"name": "b", "turns": 3}],
        }
    )
    assert [t.knobs.turns.mean for t in spec.tenants] == [1, 3]
    msg = _error(
        {
            "name": "t",
            "user_tokens": 5,
            "output_tokens": 5,
            "tenants": [{"name": "a", "turns": 1}, {"name": "b"}],
        }
    )
    assert msg.startswith("w.yaml: tenants[1].turns: missing; give it at the top level or in every tenant")


def test_file_errors(tmp_path):
    bad = _write(tmp_path, "name: x\nturns: [1, 2\n")
    msg = _message(load_spec, bad)
    assert msg.startswith(f"{bad} line 3: not valid YAML (")
    assert msg.endswith("); fix the syntax")
    dup = _write(tmp_path, "name: x\nturns: 2\nuser_tokens: 3\nturns: 4\noutput_tokens: 1\n", name="dup.yaml")
    assert _message(load_spec, dup) == (f"{dup} line 4: duplicate key 'turns'; give each key once")
    missing = tmp_path / "gone.yaml"
    msg = _message(load_workload, str(missing))
    assert msg == f"{missing}: cannot read the spec (No such file or directory); give a readable YAML file"
