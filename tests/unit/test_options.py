"""Locust-side options -> RunConfig: validation is one line per mistake and names the flag."""

from __future__ import annotations

import argparse

import pytest

from loadgen.config import Plan, RunConfig
from loadgen.errors import UserError
from loadgen.runtime.locust_options import add_arguments, config_from_options


def _parse(*args: str) -> argparse.Namespace:
    class Parser(argparse.ArgumentParser):
        def add_argument(self, *a, include_in_web_ui=True, **k):  # as Locust's parser accepts
            return super().add_argument(*a, **k)

    p = Parser()
    p.add_argument("--host", default="")
    add_arguments(p)
    return p.parse_args(list(args))


def test_defaults_give_a_poisson_open_loop_run_of_sixty_seconds() -> None:
    cfg = config_from_options(_parse("--host", "http://127.0.0.1:8000/"))
    assert cfg.target_url == "http://127.0.0.1:8000"
    assert cfg.mode == "open-loop" and cfg.arrival == "poisson"
    assert cfg.duration_s == 60.0 and cfg.num_sessions is None
    assert cfg.target_label == "127.0.0.1:8000"


def test_exact_runs_have_no_default_duration_and_closed_loop_is_labelled() -> None:
    cfg = config_from_options(_parse("--host", "http://h:1", "--num-sessions", "10", "--concurrency", "4"))
    assert cfg.duration_s is None and cfg.num_sessions == 10
    assert cfg.mode == "closed-loop"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "no target: give --host URL"),
        (("--host", "localhost:8000"), "--host 'localhost:8000' is not an http(s) URL"),
        (("--host", "http://h", "--rate", "fast"), "--rate: 'fast' is not a rate"),
        (("--host", "http://h", "--duration", "10 parsecs"), "--duration: '10 parsecs' is not a duration"),
        (("--host", "http://h", "--burstiness", "0"), "--burstiness 0: must be a number above 0"),
        (("--host", "http://h", "--workload", "nope.yaml"), "--workload nope.yaml: no such file"),
        (("--host", "http://h", "--api-key-env", "LOADGEN_TEST_UNSET_VAR"), "LOADGEN_TEST_UNSET_VAR: that environment variable is not set"),
        (("--host", "http://h", "--arrival", "trace"), "--arrival trace needs --trace FILE"),
    ],
)
def test_bad_options_give_one_line_errors(args: tuple[str, ...], message: str) -> None:
    with pytest.raises(UserError) as e:
        config_from_options(_parse(*args))
    assert message in e.value.message
    assert "\n" not in e.value.message


def test_api_key_is_named_never_stored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOADGEN_TEST_KEY", "sk-secret-value")
    cfg = config_from_options(_parse("--host", "http://h", "--api-key-env", "LOADGEN_TEST_KEY"))
    assert "sk-secret-value" not in repr(cfg.to_dict())
    assert cfg.api_key_env == "LOADGEN_TEST_KEY"


def test_plan_round_trips_over_the_wire() -> None:
    cfg = RunConfig(run_id="r", workload="tiny", rate_per_s=2.0, target_url="http://h")
    plan = Plan(cfg, 3, 1, 1234.5)
    again = Plan.from_wire(plan.to_wire())
    assert again == plan


def test_auto_arrivals_follow_a_trace_file_or_the_workloads_timestamps(tmp_path):
    from pathlib import Path

    trace = tmp_path / "times.txt"
    trace.write_text("0\n0.5\n2\n")
    mooncake = Path(__file__).resolve().parent.parent / "fixtures" / "datasets" / "mooncake.jsonl"
    cases = [
        (("--host", "http://h", "--trace", str(trace)), "trace"),
        (("--host", "http://h", "--workload", str(mooncake)), "trace"),
        (("--host", "http://h", "--workload", str(mooncake), "--arrival", "poisson"), "poisson"),
        (("--host", "http://h"), "poisson"),
    ]
    for args, want in cases:
        assert config_from_options(_parse(*args)).arrival == want, args
