"""``make demo``: the routing A/B that loadgen exists to answer, on an embedded fleet.

Two replicas of the simulated ``laptop-qwen2.5-1.5b-q4`` engine behind SGLang's real router;
eight agents run multi-turn sessions back to back (closed loop, as in the published measurement
this reproduces); the same seeded sessions run once with ``round_robin`` and once with
``cache_aware``. Cache-aware routing keeps a session on the replica that holds its prefix, so
follow-up turns skip most of their prefill.
"""

from __future__ import annotations

import click

from loadgen.ab import parse_arms, report_ab, run_ab
from loadgen.run import RunOptions

DEMO_ARMS = "round_robin=sglang:round_robin,cache_aware=sglang:cache_aware"


def demo_options(*, quick: bool, results: str) -> RunOptions:
    return RunOptions(
        workload="demo-agents",
        seed=7,
        concurrency=8,
        num_sessions=16 if quick else 32,
        replicas=2,
        router="none",
        profile="laptop-qwen2.5-1.5b-q4",
        time_scale=1.0,
        results=results,
    )


def run_demo(*, quick: bool = False, results: str = "results") -> int:
    arms = parse_arms(DEMO_ARMS)
    code, dirs = run_ab(arms, demo_options(quick=quick, results=results))
    click.echo("")
    click.echo(report_ab([a[0] for a in arms], dirs))
    return code
