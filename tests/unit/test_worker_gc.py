"""A worker's collections by the clock (loadgen/engine/worker_gc.py): while load runs the automatic
collector is off and the young generation is collected only when the stream reader idles, at most
every YOUNG_EVERY_NS, the middle one every MIDDLE_EVERY, all of them every FULL_EVERY_S, and from
the health loop once YOUNG_LATE_NS passed without; stop gives collection back to CPython. Each case
runs in a child process: the collector freezes and disables the collector of the process it is in.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from loadgen.engine.worker_gc import merge_gc


def _child(body: str) -> str:
    code = "import gc, time\nfrom loadgen.engine import worker_gc\nfrom loadgen.engine.worker_gc import ClockCollector\n"
    out = subprocess.run([sys.executable, "-c", code + textwrap.dedent(body)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def test_it_takes_over_collects_by_the_clock_and_gives_back() -> None:
    out = _child("""
        c = ClockCollector()
        assert gc.isenabled()
        c.start()
        assert not gc.isenabled() and gc.get_freeze_count() > 0
        c.at_idle()
        assert c.collections == [0, 0, 0]  # not yet YOUNG_EVERY_NS since start
        worker_gc.YOUNG_EVERY_NS = 0
        for _ in range(worker_gc.MIDDLE_EVERY * 2):
            c.at_idle()
        assert c.collections == [2 * (worker_gc.MIDDLE_EVERY - 1), 2, 0], c.collections
        worker_gc.FULL_EVERY_S = 0
        c.at_idle()
        assert c.collections[2] == 1
        f = c.figures()
        assert f["by"] == "clock" and f["collections"] == c.collections and f["pause_max_ms"] > 0
        assert f["pause_total_ms"] >= f["pause_max_ms"] * 1.5  # 21 collections, the longest one of them
        c.stop()
        assert gc.isenabled() and c.figures()["by"] == "automatic"
        c.at_idle()  # no longer active: nothing
        print(sum(c.collections))
    """)
    assert out == str(2 * 10 + 1)


def test_the_health_loop_collects_when_the_reader_does_not() -> None:
    out = _child("""
        c = ClockCollector()
        c.start()
        c.if_late()
        assert c.collections == [0, 0, 0]  # YOUNG_LATE_NS not passed
        worker_gc.YOUNG_LATE_NS = 0
        c.if_late()
        print(c.collections)
        c.stop()
    """)
    assert out == "[1, 0, 0]"


def test_the_workers_figures_merge_into_the_runs() -> None:
    a = {"by": "clock", "collections": [10, 1, 0], "pause_max_ms": 0.4, "pause_total_ms": 1.5}
    b = {"by": "clock", "collections": [7, 0, 1], "pause_max_ms": 2.5, "pause_total_ms": 4.25}
    assert merge_gc([a, b]) == {"by": "clock", "collections": [17, 1, 1], "pause_max_ms": 2.5, "pause_total_ms": 5.75}
    assert merge_gc([a, {"by": "clock", "collections": [1, 0, 0], "pause_max_ms": 0.1}])["pause_total_ms"] == 1.5
    assert merge_gc([a, {**b, "by": "automatic"}])["by"] == "automatic"
