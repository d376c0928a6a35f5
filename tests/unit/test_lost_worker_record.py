"""A lost worker's entry in run.json: counted once, its first loss and return never overwritten.

The master's bookkeeping runs in a child process: loadgen.runtime imports Locust, which patches the
standard library with gevent, and this test process must stay unpatched.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from .master_bookkeeping import MASTER_SETUP

SCRIPT = MASTER_SETUP + textwrap.dedent(
    """
    steps = {}
    rt._mark_lost("a_1")
    rt._mark_lost("a_1")  # Locust still says missing at the next check: no second entry
    steps["lost"] = dict(rt.lost["a_1"])
    rt._readmit("a_1", {"r": [], "state": {"pid": 7}})
    steps["back"] = dict(rt.lost["a_1"])
    steps["out_when_back"] = rt._out_of_run("a_1")
    rt._mark_lost("a_1", why="missed heartbeats")
    steps["again"] = dict(rt.lost["a_1"])
    steps["out_again"] = rt._out_of_run("a_1")
    steps["readmitted_again"] = rt._readmit("a_1", {"r": [{}], "state": {}})
    steps["entries"] = len(rt.lost)
    print(json.dumps(steps))
    """
)


def test_a_second_loss_is_added_beside_the_first_and_its_return() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    steps = json.loads(out.stdout.strip().splitlines()[-1])
    lost, back, again = steps["lost"], steps["back"], steps["again"]
    assert lost["why"] == "missed heartbeats" and 9.0 < lost["lost_at_s"] < 11.0
    assert back["lost_at_s"] == lost["lost_at_s"] and back["returned_at_s"] >= lost["lost_at_s"]
    assert back["heard_again_at_s"] == back["returned_at_s"] and back["pid"] == 7
    assert steps["out_when_back"] is False
    # Lost again: the first loss and its return stay as they were, the second is beside them.
    assert {k: again[k] for k in back} == back
    assert again["lost_again_at_s"] >= back["returned_at_s"] and again["why_again"] == "missed heartbeats"
    assert steps["out_again"] is True
    # Its later reports are rejected (counted), not merged a second time.
    assert steps["readmitted_again"] is False and steps["entries"] == 1
