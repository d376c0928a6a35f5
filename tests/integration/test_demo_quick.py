"""`loadgen demo --quick`: the routing A/B on two simulated laptop replicas behind sglang-router.

The quick demo runs 4 agents with one session each (4-6 turns, ~15 follow-up turns per arm).
Margins: follow-up-turn TTFT must be at least 2x lower with cache_aware at the mean and 2.5x at
p95. The full demo expects 2.5x and 4x (8 agents, as in the published measurement); with 4
agents a round-robin arm can land more turns on the replica that already holds them, and a p95
over 15 turns is close to their maximum, so the quick demo (and the test) asks for less, and
exits 3 when even that is not met. Quick runs on the 2-core
development machine measured 2.9x-4.8x (mean) and 4.4x-6.6x (p95). Whatever the ratios, the
mechanism is checked exactly: every cache_aware follow-up hits the cache of everything its
previous turn computed, on both replicas, while round-robin misses some.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import orjson
import pytest

from loadgen.commands.ab import follow_up_ttft_factors, load_summary

from .runs import loadgen, records

pytestmark = pytest.mark.slow

BLOCK = 16  # the laptop profile's prefix-cache block, in tokens


def _on_their_replica(d: Path) -> list[bool]:
    by_session: dict[str, dict[int, object]] = defaultdict(dict)
    for rec in records(d):
        by_session[rec.session_id][rec.turn_index] = rec
    out = []
    for turns in by_session.values():
        for k in range(1, len(turns)):
            prev, cur = turns[k - 1], turns[k]
            out.append(cur.cached_tokens >= (prev.prompt_tokens + prev.output_tokens - 1) // BLOCK * BLOCK)
    return out


def test_quick_demo_cuts_follow_up_ttft_with_cache_aware_routing(tmp_path):
    results = tmp_path / "results"
    r = loadgen("demo", "--quick", "--results", str(results), timeout_s=170)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rr, ca = (next(results.glob(f"*-{arm}")) for arm in ("round_robin", "cache_aware"))
    for d, policy in ((rr, "round_robin"), (ca, "cache_aware")):
        run = orjson.loads((d / "run.json").read_bytes())
        assert run["status"] == "complete" and run["mode"] == "closed-loop"
        assert run["targets"][0]["fleet"]["router"]["policy"] == policy
        assert all(rec.ok for rec in records(d))

    assert all(_on_their_replica(ca))
    assert not all(_on_their_replica(rr))
    factors = follow_up_ttft_factors(load_summary(rr), load_summary(ca))
    assert factors["mean"] >= 2.0 and factors["p95"] >= 2.5, factors

    out = r.stdout
    assert "routing A/B: 4 agents, 4 sessions of demo-agents (seed 7)" in out
    assert "ttft    follow-up  p95" in out
    assert "cache_aware vs round_robin: follow-up-turn TTFT mean " in out
    # --quick asks its own margins (the ones above), and exits 0 only when they are met
    assert "expected shape: follow-up-turn TTFT lower with cache_aware at mean >= 2x" in out
    assert out.strip().splitlines()[-1] == "loadgen demo: PASS: expected shape met"
    assert "requests per replica" in out
