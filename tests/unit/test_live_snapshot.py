"""What the live views see of the workers: the runtime's own accounting, a returned worker active.

The master's bookkeeping runs in a child process (loadgen.runtime imports Locust, which patches
the standard library with gevent; this test process must stay unpatched).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from .master_bookkeeping import MASTER_SETUP

SCRIPT = MASTER_SETUP + textwrap.dedent(
    """
    from prometheus_client.parser import text_string_to_metric_families
    from loadgen.live.exposition import render
    from loadgen.live.prometheus import collect

    def exported():
        out = {}
        for fam in text_string_to_metric_families(render(collect(rt.snapshot()))):
            for s in fam.samples:
                if s.name == "loadgen_workers":
                    out[s.labels["state"]] = s.value
        return out

    steps = {"start": exported()}
    rt._mark_lost("a_1")
    steps["lost"] = exported()
    rt._readmit("a_1", {"r": [], "state": {"pid": 7}})
    steps["back"] = exported()
    rt._mark_lost("a_1", why="missed heartbeats")
    steps["again"] = exported()
    print(json.dumps(steps))
    """
)


def test_prometheus_counts_a_worker_that_came_back_as_active_not_lost() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    steps = json.loads(out.stdout.strip().splitlines()[-1])
    assert steps["start"] == {"active": 2, "lost": 0, "standby": 0}
    assert steps["lost"] == {"active": 1, "lost": 1, "standby": 0}
    # Merged again (it was frozen, or its network came back): active, as run.json and the verdict say.
    assert steps["back"] == {"active": 2, "lost": 0, "standby": 0}
    assert steps["again"] == {"active": 1, "lost": 1, "standby": 0}
