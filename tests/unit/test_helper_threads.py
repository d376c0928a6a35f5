"""A worker's helper threads (zmq's, gevent's resolver pool) run as batch tasks at nice +5, so that
their wake-ups do not take the core from the event loop; the loop's own thread is left alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SCRIPT = """
import json, os, threading
stop = threading.Event()
threads = [threading.Thread(target=stop.wait, daemon=True) for _ in range(2)]  # as zmq's are
for t in threads: t.start()
from loadgen.runtime.helper_threads import yield_helper_threads
changed = yield_helper_threads()
later = threading.Thread(target=stop.wait, daemon=True); later.start()  # started by the loop's thread
def state(tid): return [os.sched_getscheduler(tid), os.getpriority(os.PRIO_PROCESS, tid)]
print(json.dumps({"changed": changed, "loop": state(os.getpid()), "helpers": [state(t.native_id) for t in threads],
       "later": state(later.native_id), "batch": os.SCHED_BATCH, "other": os.SCHED_OTHER}))
"""


def _run(**env: str) -> dict:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60,
                         env={**os.environ, **env})  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="no SCHED_BATCH on this system")
def test_helpers_are_batch_at_nice_5_and_the_loop_is_not() -> None:
    got = _run(LOADGEN_HELPER_THREADS="")
    base = os.getpriority(os.PRIO_PROCESS, 0)
    assert got["changed"] == 2
    assert got["helpers"] == [[got["batch"], max(base, 5)]] * 2
    assert got["loop"] == [got["other"], base]
    assert got["later"] == [got["other"], base]  # a thread started afterwards takes the loop's


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="no SCHED_BATCH on this system")
def test_normal_leaves_them_as_they_were() -> None:
    got = _run(LOADGEN_HELPER_THREADS="normal")
    assert got["changed"] == 0
    assert {tuple(s) for s in got["helpers"]} == {(got["other"], os.getpriority(os.PRIO_PROCESS, 0))}
