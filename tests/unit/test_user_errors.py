"""Which errors the CLI says as one usage line (exit 2), and which it leaves a bug's traceback.

``loadgen.errors.as_user_error`` is the one mapping: a ``UserError``, or a library's error for
bad input (workload, target, results directory). A plain ``ValueError`` from deep inside a
command is a bug: reporting it as a usage error would send the user hunting for a bad flag.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from click.testing import CliRunner

from analysis.errors import ResultsError
from loadgen.cli import main
from loadgen.errors import UserError, as_user_error
from targets.errors import TargetError
from workloads.errors import WorkloadError

TINY_RUN = Path(__file__).resolve().parents[1] / "fixtures" / "results" / "tiny"


def test_library_errors_for_bad_input_are_user_errors_and_nothing_else_is():
    for error in (WorkloadError("w.yaml line 3: bad"), TargetError("cannot reach"), ResultsError("no run.json")):
        user = as_user_error(error)
        assert isinstance(user, UserError) and user.message == str(error)
    already = UserError("--rate: bad")
    assert as_user_error(already) is already
    for bug in (ValueError("boom"), KeyError("k"), TypeError("t"), ZeroDivisionError()):
        assert as_user_error(bug) is None


def test_a_missing_results_directory_is_one_usage_line(tmp_path):
    r = CliRunner().invoke(main, ["report", str(tmp_path / "nope")])
    assert r.exit_code == 2, r.output
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "no such results directory" in lines[0], r.output


def test_a_bad_slo_is_named_as_the_flag(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(TINY_RUN, run)
    r = CliRunner().invoke(main, ["report", str(run), "--slo", "ttft_p99=fast"])
    assert r.exit_code == 2 and r.output.startswith("Error: --slo: "), r.output


def test_a_bug_inside_a_command_is_not_reported_as_a_usage_error(tmp_path, monkeypatch):
    import analysis.summary

    def broken(*_args, **_kwargs):
        raise ValueError("an internal invariant failed")

    monkeypatch.setattr(analysis.summary, "write_summary", broken)
    run = tmp_path / "run"
    shutil.copytree(TINY_RUN, run)
    r = CliRunner().invoke(main, ["report", str(run)])
    assert r.exit_code != 2, r.output
    assert isinstance(r.exception, ValueError) and "invariant" in str(r.exception)
    assert "Error:" not in r.output
