"""The demo's exit code: a shape that is NOT met fails the demo (exit 3), with a one-line reason.

The arms are not run: ``run_ab`` is replaced by one that writes each arm's summary.json with the
follow-up-turn TTFT asked for, so the shape check and the exit code are what is under test.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

import loadgen.commands.demo as demo
from loadgen.cli import main
from loadgen.commands.demo import EXIT_SHAPE_NOT_MET, demo_verdict


def test_the_verdict_from_the_arms_code_and_the_shape():
    assert demo_verdict(0, {"mean": 3.2, "p95": 7.0}) == (0, "loadgen demo: PASS: expected shape met")
    code, line = demo_verdict(0, {"mean": 3.2, "p95": 3.1})
    assert code == EXIT_SHAPE_NOT_MET == 3
    assert line == (
        "loadgen demo: FAIL (exit 3): expected shape not met: follow-up-turn TTFT lower with cache_aware "
        "at p95 3.1x (wanted >= 4x)"
    )
    assert demo_verdict(0, {"mean": None, "p95": None})[0] == 3  # no follow-up turns: no shape
    # an arm that failed decides (its figures cannot show a shape), whatever the factors
    assert demo_verdict(4, {"mean": 1.0, "p95": 1.0})[0] == 4
    assert demo_verdict(1, {"mean": 3.2, "p95": 7.0})[0] == 1
    assert demo_verdict(0, {"mean": 2.1, "p95": 2.6}, demo.expected_factors(quick=True))[0] == 0
    assert demo_verdict(0, {"mean": 2.1, "p95": 2.6}, demo.expected_factors(quick=False))[0] == 3


def _summary(follow_up_mean_ms: float, follow_up_p95_ms: float) -> dict:
    ttft = {
        "mean": follow_up_mean_ms,
        "p50": follow_up_mean_ms,
        "p95": follow_up_p95_ms,
        "p99": follow_up_p95_ms,
    }
    first = {"mean": 500.0, "p50": 500.0, "p95": 800.0, "p99": 900.0}
    return {"metrics": {"ttft": ttft}, "by_turn_class": {"first": {"metrics": {"ttft": first}},
                                                         "follow-up": {"metrics": {"ttft": ttft}}}}  # fmt: skip


@pytest.fixture
def fake_arms(monkeypatch, tmp_path):
    """run_ab that 'runs' round_robin and cache_aware with the given follow-up TTFTs (ms)."""
    arms: dict[str, tuple[float, float]] = {}

    def run_ab(arm_list, opts):
        dirs = []
        for name, _router in arm_list:
            d = Path(opts.results) / f"demo-{name}"
            d.mkdir(parents=True)
            (d / "summary.json").write_bytes(orjson.dumps(_summary(*arms[name])))
            dirs.append(d)
        return 0, dirs

    monkeypatch.setattr(demo, "run_ab", run_ab)
    return arms


def test_a_shape_not_met_exits_3_with_the_reason_last(fake_arms, tmp_path, capsys):
    fake_arms.update(round_robin=(110.0, 260.0), cache_aware=(100.0, 240.0))  # 1.1x: NOT met
    assert demo.run_demo(results=str(tmp_path)) == 3
    lines = capsys.readouterr().out.strip().splitlines()
    assert "NOT met" in lines[-3]
    assert lines[-1].startswith("loadgen demo: FAIL (exit 3): expected shape not met: follow-up-turn TTFT")
    assert "mean 1.1x (wanted >= 2.5x), p95 1.1x (wanted >= 4x)" in lines[-1]


def test_the_command_exits_with_the_demos_verdict(fake_arms, tmp_path):
    fake_arms.update(round_robin=(110.0, 260.0), cache_aware=(100.0, 240.0))
    r = CliRunner().invoke(main, ["demo", "--results", str(tmp_path / "a")])
    assert r.exit_code == 3, r.output
    fake_arms.update(round_robin=(110.0, 260.0), cache_aware=(34.0, 36.0))  # the published shape
    r = CliRunner().invoke(main, ["demo", "--results", str(tmp_path / "b")])
    assert r.exit_code == 0, r.output
    assert r.output.strip().splitlines()[-1] == "loadgen demo: PASS: expected shape met"
