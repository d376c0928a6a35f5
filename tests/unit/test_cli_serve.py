"""`loadgen serve` finds its commands in the packages that implement them, on demand."""

from __future__ import annotations

import subprocess
import sys

from click.testing import CliRunner

from loadgen.cli import main


def test_serve_lists_and_runs_its_commands_and_names_an_unknown_one() -> None:
    runner = CliRunner()
    listed = runner.invoke(main, ["serve", "--help"])
    assert listed.exit_code == 0
    for name in ("fleet", "llama-server", "sim"):
        assert f"  {name} " in listed.output, listed.output
    sim = runner.invoke(main, ["serve", "sim", "--help"])
    assert sim.exit_code == 0 and "Start a simulated LLM inference engine" in sim.output
    unknown = runner.invoke(main, ["serve", "nosuch"])
    assert unknown.exit_code == 2 and "No such command 'nosuch'" in unknown.output


def test_other_commands_do_not_import_the_simulated_engine() -> None:
    # In a fresh interpreter: this one has imported the sim for other tests already.
    probe = (
        "import sys; from click.testing import CliRunner; from loadgen.cli import main; "
        "assert CliRunner().invoke(main, ['report', '--help']).exit_code == 0; "
        "print(sorted(m for m in sys.modules if m.startswith('targets.sim')))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
