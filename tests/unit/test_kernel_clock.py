"""The kernel's receive stamps are used only where they agree with the process's wall clock."""

from __future__ import annotations

import subprocess
import sys

import pytest

from loadgen.engine.kernel_clock import TOLERANCE_NS, stamp_offset_ns

PROBE = "from loadgen.engine.kernel_clock import stamp_offset_ns, kernel_stamps_agree; print(stamp_offset_ns(), kernel_stamps_agree())"


def test_on_a_real_host_the_stamp_lies_within_the_wall_clock_reads_around_it() -> None:
    offset = stamp_offset_ns()
    assert offset is not None and 0 <= offset <= TOLERANCE_NS


@pytest.mark.parametrize("shift", ["+0.3s", "-0.2s"])
def test_a_shifted_wall_clock_turns_kernel_stamps_off(shift: str) -> None:
    libfaketime = pytest.importorskip("libfaketime", reason="libfaketime is in the dev extra")
    _, env = libfaketime.get_reload_information()
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env={**env, "FAKETIME": shift}, capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    offset, agree = out.stdout.split()
    # The shift is 200-300 ms; the stamp is off by it, and the client reads without stamps.
    assert int(offset) > 150_000_000 and agree == "False", out.stdout
    assert "kernel receive stamps are off" in out.stderr
