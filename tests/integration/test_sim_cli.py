"""The sim's command line: usage errors are one line, exit 2, never a traceback."""

from __future__ import annotations

import socket
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from targets.sim.cli import sim_command
from targets.sim.profile import profile_names


def run_sim(*args: str, timeout: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "targets.sim", *args], capture_output=True, text=True, timeout=timeout
    )


def error_lines(stderr: str) -> list[str]:
    assert "Traceback" not in stderr
    return [line for line in stderr.splitlines() if line.startswith("Error:")]


def test_unknown_profile_names_the_choices():
    res = run_sim("--profile", "h100-unknown")
    assert res.returncode == 2
    (line,) = error_lines(res.stderr)
    assert "h100-unknown" in line
    for name in profile_names():
        assert name in line


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--time-scale", "-1"], "--time-scale"),
        (["--time-scale", "nan"], "--time-scale"),
        (["--fault-cut", "1.5"], "--fault-cut"),
        (["--fault-stall", "-0.1"], "--fault-stall"),
        (["--fault-http-500", "x"], "--fault-http-500"),
        (["--fault-malformed", "2"], "--fault-malformed"),
        (["--fault-http-429", "-1"], "--fault-http-429"),
        (["--stall-s", "-2"], "--stall-s"),
        (["--port", "70000"], "--port"),
    ],
)
def test_bad_flags_are_one_line_errors(args, flag):
    res = run_sim("--profile", "tiny", *args)
    assert res.returncode == 2
    (line,) = error_lines(res.stderr)
    assert flag in line


def test_port_in_use_is_a_one_line_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        res = run_sim("--profile", "tiny", "--port", str(s.getsockname()[1]))
    assert res.returncode == 2
    (line,) = error_lines(res.stderr)
    assert "cannot start the sim" in line


def test_sim_command_mounts_under_a_group():
    assert isinstance(sim_command, click.Command)

    @click.group()
    def serve():
        pass

    serve.add_command(sim_command)
    res = CliRunner().invoke(serve, ["sim", "--help"])
    assert res.exit_code == 0
    for flag in ("--port", "--profile", "--time-scale", "--seed", "--fault-cut", "--truth-log", "--server-id"):
        assert flag in res.output
    res = CliRunner().invoke(serve, ["sim", "--profile", "nope"])
    assert res.exit_code == 2
