"""Network partitions between a worker and its master, on loopback: a short one heals with nothing
lost; a long one is one loss, with the worker's return recorded beside it.

Worker A reaches the master through ``tests/partition_proxy.py``, whose link the test cuts and
heals; worker B connects directly. The sim's truth log says what reached the server and when (on
the same monotonic clock as this test); the results directory is what the master kept.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import free_port

from .runs import records, sim, truth
from .test_distributed_chaos import H200, _locust_child, _master, _processes, _run_json, _start, _wait_for

pytestmark = pytest.mark.slow

PROXY = str(Path(__file__).parents[1] / "partition_proxy.py")
# The master loses a worker silent for 3 s (the least allowed); the workers wait 10 s for theirs.
WORKER_LOSS_TIMEOUT_S = 3.0
MASTER_LOSS_TIMEOUT_S = 10.0
# A cut this much shorter than the master's timeout heals: the master's silence is the cut plus up
# to one heartbeat interval (the last heartbeat came up to 1 s before it), and 1 s is left over.
SHORT_CUT_S = WORKER_LOSS_TIMEOUT_S - 2.0
# A cut this long is a loss: silence past the timeout, plus the interval the master may take to
# see it, plus 2 s for a busy 2-core machine; still 4 s short of the worker's own timeout.
LONG_CUT_S = WORKER_LOSS_TIMEOUT_S + 3.0


def _proxy(upstream_port: int) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, PROXY, str(upstream_port)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("PORT "), line
    return proc, int(line.split()[1])


def _worker(port: int, master_loss_timeout_s: float) -> list[str]:
    timeout = f"{master_loss_timeout_s:g}s"
    return ["worker", "--master-host", "127.0.0.1", "--master-port", str(port), "--master-loss-timeout", timeout]


def test_a_short_partition_heals_and_a_long_one_is_one_loss_with_its_return(tmp_path, capsys) -> None:
    # 260 sessions at 20/s: arrivals go on for 13 s. A's link is cut for 1 s at 1 s (it heals),
    # then for 6 s at 4.5 s (the master loses A at ~7-8 s and re-plans its arrivals onto B; A,
    # which waits 10 s for its master, is still there when the link comes back).
    figures = run_partitions(tmp_path, WORKER_LOSS_TIMEOUT_S, MASTER_LOSS_TIMEOUT_S, SHORT_CUT_S, LONG_CUT_S, n=260)
    with capsys.disabled():
        print(f"\n[partitions] {figures}")


def run_partitions(
    tmp_path: Path, worker_loss_timeout_s: float, master_loss_timeout_s: float, short_cut_s: float, long_cut_s: float, n: int
) -> str:
    """One run at 20 sessions/s with two cuts of A's link (at 1 s, and at 4.5 s or after the first
    heal); checks what the master kept against the sim's truth and returns the figures in a line."""
    port, results = free_port(), tmp_path / "results"
    run_dir = results / "part"
    with sim(tmp_path, *H200, "--seed", "1") as (proc, truth_log), _processes() as procs:
        timeout = f"{worker_loss_timeout_s:g}s"
        args = _master(proc.url, port, results, "part", "--rate", "20", "--num-sessions", str(n), "--worker-loss-timeout", timeout)
        procs.append(_start(args, tmp_path / "m.log"))
        proxy, proxy_port = _proxy(port)
        procs.append(proxy)
        a = _start(_worker(proxy_port, master_loss_timeout_s), tmp_path / "a.log")
        procs.append(a)
        a_pid = _locust_child(a).pid
        # B is never cut off; its timeout is too short for the master's, which it must say at the start.
        b_timeout_s = worker_loss_timeout_s + 2.0
        procs.append(_start(_worker(port, b_timeout_s), tmp_path / "b.log"))
        info = _wait_for(lambda: (i := _run_json(run_dir)).get("workers") and i, 60, "the run to start")
        t0 = info["t0_unix_s"]
        cuts: list[tuple[float, float]] = []  # (cut, heal) in s since the run's start
        cut_ns: list[int] = []
        for at_s, length_s in ((1.0, short_cut_s), (max(4.5, short_cut_s + 3.0), long_cut_s)):
            time.sleep(max(0.0, t0 + at_s - time.time()))
            cut_ns.append(time.perf_counter_ns())
            proxy.send_signal(signal.SIGUSR1)
            start = time.time() - t0
            time.sleep(length_s)
            proxy.send_signal(signal.SIGUSR2)
            cuts.append((start, time.time() - t0))
        code = procs[0].wait(timeout=120)
        master_log = (tmp_path / "m.log").read_text()
        assert code == 5, master_log[-3000:]
        a_log = (tmp_path / "a.log").read_text()
        b_log = (tmp_path / "b.log").read_text()
        time.sleep(0.3)
    info = _run_json(run_dir)
    recs = records(run_dir)
    served = {rid: t for rid, t in truth(truth_log).items() if rid.startswith("part-")}
    (short_cut, short_heal), (long_cut, long_heal) = cuts

    # One loss, of A, during the long cut: none in the short one; its return kept beside it.
    [lost] = info["lost_workers"]
    assert lost["pid"] == a_pid
    assert long_cut + worker_loss_timeout_s - 1.0 < lost["lost_at_s"] < long_heal
    assert long_heal - 0.1 < lost["heard_again_at_s"] < long_heal + 2.0
    assert "lost_again_at_s" not in lost and "returned_at_s" not in lost
    # Its arrivals went to B; its late reports (sessions B may have sent too) were rejected.
    [b_id] = lost["replanned_onto"]
    assert lost["told_to_stop"] is True and lost["late_records_rejected"] > 0
    assert "master lost" not in a_log  # A waited for its master longer than the master for A
    assert "warning: this worker's --master-loss-timeout" not in a_log
    assert (
        f"warning: this worker's --master-loss-timeout {b_timeout_s:g}s must be at least 3s longer than "
        f"--worker-loss-timeout {worker_loss_timeout_s:g}s"
    ) in b_log, b_log[-2000:]

    # Nothing twice, nothing invented; B's slot lost nothing the sim served.
    assert [k for k, c in Counter((r.session_index, r.turn_index) for r in recs).items() if c > 1] == []
    assert info["requests_recorded"] == len(recs) == len({r.request_id for r in recs})
    recorded = {r.request_id for r in recs}
    assert recorded <= set(served)
    unrecorded = set(served) - recorded
    assert all(int(rid.split("-")[1]) % 2 == lost["slot"] for rid in unrecorded)
    # The short cut lost nothing: every request the sim got until 1 s before the long cut (its
    # report was on the master's side of the link by then) is recorded, A's during the short cut too.
    before_long_cut = {rid for rid, t in served.items() if t["t_received_ns"] < cut_ns[1] - 1_000_000_000}
    assert before_long_cut <= recorded
    during_short = [rid for rid in before_long_cut if cut_ns[0] <= served[rid]["t_received_ns"] < cut_ns[0] + short_cut_s * 1e9]
    a_slot_during_short = [rid for rid in during_short if int(rid.split("-")[1]) % 2 == lost["slot"]]
    assert a_slot_during_short, "A sent nothing during the short cut: the test cut nothing"
    adopted = [r for r in recs if r.worker == b_id and r.session_index % 2 == lost["slot"]]
    assert adopted and all(r.t_sched_us / 1e6 >= lost["arrivals_from_s"] for r in adopted if r.turn_index == 0)
    acc = info["accounting"]
    assert acc["sessions_started"] + sum(acc["sessions_not_started"].values()) == n
    not_started = acc["sessions_not_started"]
    return (
        f"--worker-loss-timeout {worker_loss_timeout_s:g}s, --master-loss-timeout {master_loss_timeout_s:g}s: "
        f"cut {short_cut:.1f}-{short_heal:.1f} s healed ({len(a_slot_during_short)} of A's requests sent meanwhile, "
        f"all recorded); cut {long_cut:.1f}-{long_heal:.1f} s: lost at {lost['lost_at_s']} s "
        f"({lost['lost_at_s'] - long_cut:.1f} s into it), heard again at {lost['heard_again_at_s']} s "
        f"({lost['heard_again_at_s'] - long_heal:+.2f} s after the heal); {lost['late_records_rejected']} late records "
        f"rejected, {len(adopted)} of its slot's requests sent by B; {acc['sessions_started']} of {n} sessions "
        f"started, not started: {not_started}"
    )


if __name__ == "__main__":
    # The figures of docs/distributed.md, at the default timeouts: a 3 s cut, then an 8 s one.
    import tempfile

    from loadgen.runtime.loss_timeouts import DEFAULT_MASTER_LOSS_TIMEOUT_S, DEFAULT_WORKER_LOSS_TIMEOUT_S

    with tempfile.TemporaryDirectory() as d:
        print(run_partitions(Path(d), DEFAULT_WORKER_LOSS_TIMEOUT_S, DEFAULT_MASTER_LOSS_TIMEOUT_S, 3.0, 8.0, n=400))
