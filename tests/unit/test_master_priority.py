"""The master lowers its own priority once, by MASTER_NICE over what it started with, however many
runs it starts (loadgen/runtime/master_priority.py). Run in a child: niceness cannot be raised back."""

from __future__ import annotations

import subprocess
import sys

from loadgen.runtime.master_priority import MASTER_NICE


def test_the_master_yields_once_by_master_nice_and_a_second_run_adds_nothing() -> None:
    code = (
        "import os\n"
        "from loadgen.runtime.master_priority import yield_to_workers\n"
        "start = os.nice(0)\n"
        "first = yield_to_workers()\n"
        "second = yield_to_workers()\n"
        "print(start, first, second, os.nice(0))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    start, first, second, now = map(int, out)
    expected = min(start + MASTER_NICE, 19)
    assert first == second == now == expected
