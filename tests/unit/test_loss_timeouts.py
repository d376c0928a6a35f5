"""The master's and the workers' loss timeouts: their options, their checks, and how they map onto
Locust's heartbeat counting."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from loadgen.cli import main
from loadgen.errors import UserError
from loadgen.runtime.loss_timeouts import (
    DEFAULT_MASTER_LOSS_TIMEOUT_S,
    DEFAULT_WORKER_LOSS_TIMEOUT_S,
    HEARTBEAT_INTERVAL_S,
    LOSS_TIMEOUT_MARGIN_S,
    check_timeouts_consistent,
    heartbeat_liveness,
    missed_checks,
    parse_loss_timeout,
    timeouts_warning,
)
from loadgen.runtime.master_watch import MISSED_CHECKS_LIMIT, MasterWatch


def _locust_checks_until_missing(liveness: int) -> int:
    """Checks of Locust's ``MasterRunner.heartbeat_worker`` (one an interval) after a worker's last
    heartbeat until it marks the worker missing: the count starts at the liveness, each check takes
    one off, and the check that finds it below zero marks the worker missing."""
    count, checks = liveness, 0
    while True:
        checks += 1
        if count < 0:
            return checks
        count -= 1


def _locust_runners_constant(name: str) -> object:
    # Read from the source: importing Locust here would monkey-patch this test process with gevent.
    spec = importlib.util.find_spec("locust")  # a top-level spec, found without importing it
    assert spec is not None and spec.origin is not None
    tree = ast.parse((Path(spec.origin).parent / "runners.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"locust.runners has no {name}")


def test_the_interval_is_locusts() -> None:
    assert _locust_runners_constant("HEARTBEAT_INTERVAL") == HEARTBEAT_INTERVAL_S
    # Locust's own liveness (3) loses a worker after 4-5 silent s; the default timeout says 5-6 s.
    assert heartbeat_liveness(DEFAULT_WORKER_LOSS_TIMEOUT_S) == _locust_runners_constant("HEARTBEAT_LIVENESS") + 1


@pytest.mark.parametrize("timeout_s", [3.0, 4.5, 5.0, 10.0, 60.0])
def test_the_master_loses_a_worker_silent_for_the_timeout_within_one_interval_more(timeout_s: float) -> None:
    checks = _locust_checks_until_missing(heartbeat_liveness(timeout_s))
    # The first check comes up to one interval after the last heartbeat: silence in
    # ((checks - 1) * interval, checks * interval] when the worker is marked missing.
    assert (checks - 1) * HEARTBEAT_INTERVAL_S >= timeout_s
    assert (checks - 1) * HEARTBEAT_INTERVAL_S < timeout_s + HEARTBEAT_INTERVAL_S


def test_the_worker_counts_its_timeout_in_silent_checks() -> None:
    assert missed_checks(DEFAULT_MASTER_LOSS_TIMEOUT_S) == MISSED_CHECKS_LIMIT == 15
    watch = MasterWatch(SimpleNamespace(events=SimpleNamespace()), lambda _s: None, missed_limit=missed_checks(6.5))
    watch._on_heartbeat()
    assert watch.check() is False
    assert [watch.check() for _ in range(7)] == [False] * 6 + [True]


def test_the_defaults_give_the_worker_the_longer_wait() -> None:
    check_timeouts_consistent(DEFAULT_WORKER_LOSS_TIMEOUT_S, DEFAULT_MASTER_LOSS_TIMEOUT_S)
    # The worker is sure to hear nothing for a whole margin after the master decided.
    worst_master_s = DEFAULT_WORKER_LOSS_TIMEOUT_S + HEARTBEAT_INTERVAL_S + 0.25
    earliest_worker_s = DEFAULT_MASTER_LOSS_TIMEOUT_S - HEARTBEAT_INTERVAL_S
    assert earliest_worker_s > worst_master_s
    assert timeouts_warning(DEFAULT_WORKER_LOSS_TIMEOUT_S, DEFAULT_MASTER_LOSS_TIMEOUT_S) is None


def test_a_worker_that_would_give_up_first_is_refused_or_warned() -> None:
    with pytest.raises(UserError, match=r"--master-loss-timeout 6s must be at least 3s longer than --worker-loss-timeout 5s"):
        check_timeouts_consistent(5.0, 6.0)
    text = timeouts_warning(5.0, 5.0 + LOSS_TIMEOUT_MARGIN_S - 0.5)
    assert text is not None and "the master's is 5s" in text


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("2s", "--worker-loss-timeout 2s: must be between 3s and 600s"),
        ("11m", "--worker-loss-timeout 11m: must be between 3s and 600s"),
        ("soon", "--worker-loss-timeout: 'soon' is not a duration"),
    ],
)
def test_out_of_range_timeouts_are_one_line_errors(value: str, message: str) -> None:
    with pytest.raises(UserError) as e:
        parse_loss_timeout("--worker-loss-timeout", value)
    assert message in e.value.message and "\n" not in e.value.message


def test_parse_gives_seconds() -> None:
    assert parse_loss_timeout("--master-loss-timeout", "1m") == 60.0
    assert parse_loss_timeout("--master-loss-timeout", "3") == 3.0


def test_the_worker_command_refuses_a_bad_timeout_before_it_starts() -> None:
    r = CliRunner().invoke(main, ["worker", "--master-host", "127.0.0.1", "--master-loss-timeout", "1s"])
    assert r.exit_code == 2
    assert r.output.strip().splitlines()[-1] == (
        "Error: --master-loss-timeout 1s: must be between 3s and 600s (heartbeats come once a second); "
        "e.g. --master-loss-timeout 10s"
    )
    r = CliRunner().invoke(main, ["worker", "--master-host", "127.0.0.1", "--master-loss-timeout", "soon"])
    assert r.exit_code == 2 and "'soon' is not a duration" in r.output


def test_the_master_command_refuses_a_bad_timeout_before_it_starts(tmp_path) -> None:
    args = ["master", "--expect-workers", "1", "--target", "http://127.0.0.1:9", "--results", str(tmp_path)]
    r = CliRunner().invoke(main, [*args, "--worker-loss-timeout", "2s"])
    assert r.exit_code == 2
    assert "Error: --worker-loss-timeout 2s: must be between 3s and 600s" in r.output
    assert list(tmp_path.iterdir()) == []  # nothing started, nothing written
