"""The generator flags itself saturated from its own signals (loadgen/engine/health.py), and only then.

Two runs of the same short workload against one sim, side by side: one with a greenlet that holds
the worker's event loop busy for 350 ms of every second (the ``LOADGEN_TEST_BURN`` hook), one
without. The bound is 300 ms for both, far above what a busy shared test machine adds to a free
loop (a few ms) and below the burn, so the verdicts are certain by construction, not timing. The
first second is warm-up: a worker that gets its plan late on a loaded machine sends its first
arrivals late, which is start-up, not saturation.
"""

from __future__ import annotations

import os
import subprocess

import orjson
import pytest

from loadgen.engine.health import BURN_ENV

from .runs import LOADGEN, run_dir, sim

pytestmark = pytest.mark.slow

BOUND = ("--max-schedule-lag", "300ms")


def _start(url: str, results, burn: str | None) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != BURN_ENV}
    env["PYTHONUNBUFFERED"] = "1"
    if burn:
        env[BURN_ENV] = burn
    args = ["run", "--target", url, "--workload", "tiny", "--rate", "10", "--num-sessions", "25", "--seed", "4",
            "--warmup", "1s", "--results", str(results), *BOUND]  # fmt: skip
    return subprocess.Popen([*LOADGEN, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _finish(p: subprocess.Popen) -> tuple[int, str]:
    try:
        _, err = p.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        raise
    return p.returncode, err


def test_a_burning_worker_flags_saturation_and_exits_4_while_a_free_one_passes(tmp_path) -> None:
    with sim(tmp_path, "--profile", "tiny", "--seed", "4") as (proc, _):
        burned = _start(proc.url, tmp_path / "burned", "350/1000")
        free = _start(proc.url, tmp_path / "free", None)
        burned_rc, burned_err = _finish(burned)
        free_rc, free_err = _finish(free)

    assert burned_rc == 4, burned_err[-2000:]
    verdict = burned_err.strip().splitlines()[-1]
    assert verdict.startswith("loadgen verdict: FAIL (exit 4): generator saturated: "), verdict
    assert "event-loop-lag p99" in verdict and "300.0 ms" in verdict
    d = run_dir(tmp_path / "burned")
    gen = orjson.loads((d / "run.json").read_bytes())["generator"]
    assert gen["test_burn"] == "350/1000"
    assert gen["loop_lag_ms"]["p99"] > 300.0 and gen["loop_lag_ms"]["count"] > 10
    summary = orjson.loads((d / "summary.json").read_bytes())["generator"]
    assert summary["saturated"] and any(s.startswith("event-loop-lag p99") for s in summary["saturated_by"])

    assert free_rc == 0, free_err[-2000:]
    d = run_dir(tmp_path / "free")
    gen = orjson.loads((d / "run.json").read_bytes())["generator"]
    assert "test_burn" not in gen
    # Both signals were measured (not merely absent) and stayed under the bound.
    assert gen["loop_lag_ms"]["count"] > 10 and gen["loop_lag_ms"]["p99"] < 300.0
    assert gen["recv_delay_ms"]["count"] > 10 and gen["recv_delay_ms"]["p99"] < 300.0
    # The worker collected its garbage by the clock, between reads (loadgen/engine/worker_gc.py).
    assert gen["gc"]["by"] == "clock" and gen["gc"]["collections"][0] > 0, gen["gc"]
    assert gen["gc"]["pause_total_ms"] >= gen["gc"]["pause_max_ms"] > 0, gen["gc"]
    summary = orjson.loads((d / "summary.json").read_bytes())["generator"]
    assert not summary["saturated"] and summary["saturated_by"] == []
