"""Workload specs: a YAML file (or an equivalent mapping) describing synthetic agent sessions.

Keys (docs/workloads.md has the full reference)::

    name: agentic-coding            # required
    description: ...                # optional text
    system_prompt_tokens: 3000      # shared by every session of a tenant (default 0: none)
    turns: {dist: uniform, low: 5, high: 20}     # required, >= 1
    first_user_tokens: 400          # the opening user message (default: user_tokens)
    user_tokens: 200                # required: each follow-up user message
    tool_turn_fraction: 0.7         # share of follow-up turns that are tool results (default 0)
    tool_output_tokens: ...         # a tool result's size (required when tool_turn_fraction > 0)
    output_tokens: 256              # required: max_tokens of every turn, >= 1
    think_time: 5s                  # wait before a follow-up user turn (default 0)
    tool_time: 1s                   # wait before a tool-result turn (default: think_time)
    cold_prefill: false             # every request asks for a unique nonce at the prompt start
    steps: [...]                    # instead of turns: a DAG of steps (fan-outs, tool calls);
                                    # see workloads.steps
    tenants:                        # optional named mix; default one tenant named "default"
      - {name: team-a, weight: 3, output_tokens: 128}

Each knob is a distribution (see :mod:`workloads.distributions`). A tenant may override any knob.
Every error is a :class:`WorkloadError` whose one-line message names the file and the key.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from workloads.distributions import Distribution, fixed, parse_distribution
from workloads.errors import WorkloadError
from workloads.steps import StepSpec, parse_steps

# Bumped whenever the way sessions are generated from a spec changes, so fingerprints change too.
GENERATOR_VERSION = 1

DEFAULT_TENANT = "default"

# knob name -> (integer, duration, at_least)
_KNOBS: dict[str, tuple[bool, bool, int]] = {
    "system_prompt_tokens": (True, False, 0),
    "turns": (True, False, 1),
    "first_user_tokens": (True, False, 1),
    "user_tokens": (True, False, 1),
    "tool_output_tokens": (True, False, 1),
    "output_tokens": (True, False, 1),
    "think_time": (False, True, 0),
    "tool_time": (False, True, 0),
}
_SCALARS = ("tool_turn_fraction", "cold_prefill")
KNOB_KEYS: tuple[str, ...] = (*_KNOBS, *_SCALARS)
TOP_KEYS: tuple[str, ...] = ("name", "description", *KNOB_KEYS, "steps", "tenants")
TENANT_KEYS: tuple[str, ...] = ("name", "weight", *KNOB_KEYS)
REQUIRED: tuple[str, ...] = ("name", "turns", "user_tokens", "output_tokens")
# Required knobs may instead be given in every tenant.


@dataclass(frozen=True, slots=True)
class Knobs:
    """The resolved knobs of one tenant: what its sessions look like."""

    system_prompt_tokens: Distribution
    turns: Distribution
    first_user_tokens: Distribution
    user_tokens: Distribution
    tool_output_tokens: Distribution | None
    tool_turn_fraction: float
    output_tokens: Distribution
    think_time: Distribution
    tool_time: Distribution
    cold_prefill: bool
    steps: tuple[StepSpec, ...] | None = None  # a DAG of steps instead of `turns` (then None)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None:
                continue
            if f.name == "steps":
                out[f.name] = [step.to_dict() for step in v]
            else:
                out[f.name] = v.to_dict() if isinstance(v, Distribution) else v
        return out


@dataclass(frozen=True, slots=True)
class TenantSpec:
    """A named share of the traffic with its own knobs."""

    name: str
    weight: float
    knobs: Knobs


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """A validated spec: name, description, and the tenants with their resolved knobs."""

    name: str
    description: str
    tenants: tuple[TenantSpec, ...]
    # The canonical form of what the user wrote (durations in seconds), for to_dict.
    data: dict[str, Any] = field(compare=False, hash=False)

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(self.data))

    def fingerprint(self) -> str:
        """sha256 over what determines the sessions: the generator version and each tenant's knobs.

        The name and description do not count: two specs that generate the same traffic match.
        """
        content = {
            "generator": GENERATOR_VERSION,
            "tenants": [
                {"name": t.name, "weight": _num(t.weight), "knobs": t.knobs.to_dict()} for t in self.tenants
            ],
        }
        blob = json.dumps(content, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()


def _num(x: float) -> float | int:
    return int(x) if float(x).is_integer() else float(x)


def load_spec(path: str | Path, *, label: str | None = None) -> WorkloadSpec:
    """Read and validate a YAML spec file. ``label`` names it in errors (default: the path)."""
    path = Path(path)
    where = label or str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        reason = e.strerror or str(e)
        raise WorkloadError(f"{where}: cannot read the spec ({reason}); give a readable YAML file") from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass
    except _DuplicateKey as e:
        raise WorkloadError(f"{where} line {e.line}: duplicate key {e.key!r}; give each key once") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or "syntax error"
        raise WorkloadError(f"{where}{at}: not valid YAML ({problem}); fix the syntax") from None
    return parse_spec(data, where=where)


def parse_spec(data: Any, *, where: str = "<spec>") -> WorkloadSpec:
    """Validate a spec mapping (as loaded from YAML). ``where`` prefixes every error message."""
    if not isinstance(data, Mapping):
        raise WorkloadError(f"{where}: the spec must be a mapping of keys ({', '.join(REQUIRED)}, ...)")
    _check_keys(data, TOP_KEYS, where=where, at="")
    if "name" not in data:
        raise WorkloadError(f"{where}: name: missing; a spec needs {', '.join(REQUIRED)}")
    name = data["name"]
    if not isinstance(name, str) or not name.strip():
        raise WorkloadError(f"{where}: name: {name!r} is not a name; use a non-empty string")
    description = data.get("description", "")
    if description is None:
        description = ""
    if not isinstance(description, str):
        raise WorkloadError(f"{where}: description: {description!r} is not text; use a string")

    base = {k: data[k] for k in KNOB_KEYS if k in data}
    canonical: dict[str, Any] = {"name": name}
    if description:
        canonical["description"] = description
    canonical.update(_canonical_knobs(base, where=where, prefix=""))
    steps = None
    if "steps" in data:
        steps = parse_steps(data["steps"], where=where)
        canonical["steps"] = [step.to_dict() for step in steps]

    raw_tenants = data.get("tenants")
    implicit = raw_tenants is None  # one tenant, "default": errors name top-level keys only
    if implicit:
        raw_tenants = [{"name": DEFAULT_TENANT}]
    elif not isinstance(raw_tenants, list) or not raw_tenants:
        raise WorkloadError(
            f"{where}: tenants: {raw_tenants!r} is not a list of tenants; use a non-empty list of "
            "mappings with name, weight and knob overrides"
        )
    else:
        canonical["tenants"] = []
    tenants: list[TenantSpec] = []
    seen: set[str] = set()
    for i, raw in enumerate(raw_tenants):
        at = f"tenants[{i}]"
        if not isinstance(raw, Mapping):
            raise WorkloadError(f"{where}: {at}: {raw!r} is not a mapping; use {{name: ..., weight: ...}}")
        _check_keys(raw, TENANT_KEYS, where=where, at=at + ".")
        if "name" not in raw:
            raise WorkloadError(f"{where}: {at}.name: missing; every tenant needs a name")
        tname = raw["name"]
        if not isinstance(tname, str) or not tname.strip():
            raise WorkloadError(f"{where}: {at}.name: {tname!r} is not a name; use a non-empty string")
        if tname in seen:
            raise WorkloadError(f"{where}: {at}.name: tenant {tname!r} appears twice; use unique names")
        seen.add(tname)
        weight = raw.get("weight", 1)
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 < weight < math.inf:
            raise WorkloadError(f"{where}: {at}.weight: {weight!r} is not allowed; use a number > 0")
        overrides = {k: raw[k] for k in KNOB_KEYS if k in raw}
        prefix = "" if implicit else at + "."
        knobs = _resolve({**base, **overrides}, where=where, prefix=prefix, overrides=overrides, steps=steps)
        tenants.append(TenantSpec(tname, float(weight), knobs))
        if "tenants" in canonical:
            entry = {"name": tname, "weight": _num(float(weight))}
            entry.update(_canonical_knobs(overrides, where=where, prefix=at + "."))
            canonical["tenants"].append(entry)
    return WorkloadSpec(name, description, tuple(tenants), canonical)


def _check_keys(data: Mapping, allowed: tuple[str, ...], *, where: str, at: str) -> None:
    for key in data:
        if key not in allowed:
            raise WorkloadError(f"{where}: {at}{key}: unknown key; use one of {', '.join(allowed)}")


def _parse_knob(key: str, value: Any, *, where: str, prefix: str) -> Distribution:
    integer, duration, at_least = _KNOBS[key]
    return parse_distribution(
        value, where=f"{where}: {prefix}{key}", integer=integer, duration=duration, at_least=at_least
    )


def _parse_fraction(value: Any, *, where: str, prefix: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise WorkloadError(
            f"{where}: {prefix}tool_turn_fraction: {value!r} is not allowed; use a number from 0 to 1"
        )
    return float(value)


def _parse_bool(value: Any, *, where: str, prefix: str) -> bool:
    if not isinstance(value, bool):
        raise WorkloadError(f"{where}: {prefix}cold_prefill: {value!r} is not allowed; use true or false")
    return value


def _canonical_knobs(values: Mapping[str, Any], *, where: str, prefix: str) -> dict[str, Any]:
    """Validate the knobs given at one level and return their canonical form (durations in seconds)."""
    out: dict[str, Any] = {}
    for key in KNOB_KEYS:
        if key not in values:
            continue
        if key == "tool_turn_fraction":
            out[key] = _num(_parse_fraction(values[key], where=where, prefix=prefix))
        elif key == "cold_prefill":
            out[key] = _parse_bool(values[key], where=where, prefix=prefix)
        else:
            out[key] = _parse_knob(key, values[key], where=where, prefix=prefix).to_dict()
    return out


def _resolve(
    values: Mapping[str, Any],
    *,
    where: str,
    prefix: str,
    overrides: Mapping[str, Any],
    steps: tuple[StepSpec, ...] | None = None,
) -> Knobs:
    """The full knob set of one tenant: its overrides over the top level, defaults filled in."""

    def knob(key: str, default: Distribution | None) -> Distribution | None:
        if key not in values:
            return default
        # Name the tenant in errors only for keys the tenant itself set.
        return _parse_knob(key, values[key], where=where, prefix=prefix if key in overrides else "")

    def level(key: str) -> str:
        return prefix if key in overrides else ""

    user = knob("user_tokens", None)
    think = knob("think_time", fixed(0.0))
    fraction = (
        _parse_fraction(values["tool_turn_fraction"], where=where, prefix=level("tool_turn_fraction"))
        if "tool_turn_fraction" in values
        else 0.0
    )
    tool_output = knob("tool_output_tokens", None)
    if steps is not None and "turns" in values:
        raise WorkloadError(
            f"{where}: {level('turns')}turns: given with steps; a session is either turns in a chain or steps"
        )
    if steps is not None and tool_output is None:
        for step in steps:
            if step.kind == "tool" and step.input_tokens is None:
                raise WorkloadError(
                    f"{where}: {prefix}tool_output_tokens: missing; the tool step {step.step_id!r} needs it "
                    "(or give the step input_tokens)"
                )
    if fraction > 0 and tool_output is None:
        raise WorkloadError(
            f"{where}: {prefix}tool_output_tokens: missing; needed when tool_turn_fraction > 0 "
            f"(it is {_num(fraction)})"
        )
    cold = False
    if "cold_prefill" in values:
        cold = _parse_bool(values["cold_prefill"], where=where, prefix=level("cold_prefill"))
    needed = ("user_tokens", "output_tokens") if steps is not None else ("turns", "user_tokens", "output_tokens")
    missing = [k for k in needed if k not in values]
    if missing:
        raise WorkloadError(
            f"{where}: {prefix}{missing[0]}: missing; give it at the top level or in every tenant "
            f"(a spec needs {', '.join(REQUIRED)})"
        )
    return Knobs(
        system_prompt_tokens=knob("system_prompt_tokens", fixed(0, integer=True)),
        turns=knob("turns", fixed(1, integer=True) if steps is not None else None),
        first_user_tokens=knob("first_user_tokens", user),
        user_tokens=user,
        tool_output_tokens=tool_output,
        tool_turn_fraction=fraction,
        output_tokens=knob("output_tokens", None),
        think_time=think,
        tool_time=knob("tool_time", think),
        cold_prefill=cold,
        steps=steps,
    )


class _DuplicateKey(Exception):
    def __init__(self, key: Any, line: int):
        super().__init__(key)
        self.key, self.line = key, line


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                dup = key in seen
            except TypeError:
                continue
            if dup:
                raise _DuplicateKey(key, key_node.start_mark.line + 1)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _StrictLoader.construct_mapping)
