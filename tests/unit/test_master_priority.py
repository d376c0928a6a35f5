"""The master yields the CPU to workers on its host: it times no tokens, and a burst of merging
there must not hold a worker's reads (loadgen/runtime/master.py, ``yield_cpu_to_workers``). Run
in a child: loadgen.runtime patches the standard library with gevent, and the nice is for good."""

from __future__ import annotations

import subprocess
import sys


def test_the_master_lowers_its_own_priority_only() -> None:
    script = (
        "import os\n"
        "from loadgen.runtime.master import MASTER_NICE, yield_cpu_to_workers\n"
        "before = os.getpriority(os.PRIO_PROCESS, 0)\n"
        "yield_cpu_to_workers()\n"
        "print(os.getpriority(os.PRIO_PROCESS, 0) - before, MASTER_NICE)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    raised, nice = out.stdout.split()
    assert int(raised) == int(nice) == 10
