"""A report whose records the master cannot read: nothing of it merged, run.json names it, and a
lost worker's rejected records are counted whatever form they came in."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from .master_bookkeeping import MASTER_SETUP

SCRIPT = MASTER_SETUP + textwrap.dedent(
    """
    from analysis.records import RequestRecord
    from loadgen.engine.recorder import MetricsAggregate, Recorder

    class Writer:
        updates = []
        records = []
        def update_run(self, **fields): self.updates.append(fields)
        def append_records(self, records): self.records.extend(records)
        def flush_records(self): pass

    rt.writer = Writer()
    rt.aggregate = MetricsAggregate()
    rt._stop_if_unwritable = lambda: None
    w = Recorder(wire_records=True)
    for i in range(3):
        w.record_request(RequestRecord(request_id=f"r{i}", session_id="s", session_index=0, turn_index=i,
                                       turn_class="first", tenant="t", target="x", worker="a_1", status="ok",
                                       t_sched_us=0, t_send_us=1, t_first_us=5, t_last_us=9, t_end_us=9,
                                       output_tokens=2, chunks=2, itl_us=[4]))
    good = {**w.take_delta().to_wire(), "run_id": "r", "state": {"started": 1}}
    bad = {**good, "rp": good["rp"][:-3], "state": {"started": 2}}
    steps = {}
    rt._on_worker_report("a_1", {"loadgen": bad})
    steps["after_bad"] = [rt.aggregate.requests, len(rt.writer.records), rt.worker_state["a_1"]["started"],
                          rt.writer.updates[-1]]
    rt._on_worker_report("a_1", {"loadgen": good})
    steps["after_good"] = [rt.aggregate.requests, len(rt.writer.records)]
    rt._mark_lost("b_1")
    rt.lost["b_1"]["replaced_by"] = "c_1"
    rt._readmit("b_1", bad)
    steps["rejected"] = rt.lost["b_1"]["late_records_rejected"]
    print(json.dumps(steps))
    """
)


def test_an_unreadable_report_is_named_and_nothing_of_it_merged() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    steps = json.loads(out.stdout.strip().splitlines()[-1])
    requests, written, started, update = steps["after_bad"]
    assert (requests, written, started) == (0, 0, 2)  # its state is still heard
    [entry] = update["unreadable_reports"]
    assert entry["worker"] == "a_1" and entry["reports"] == 1 and entry["records"] == 3
    assert "rows read where the report says 3" in entry["why"]
    assert "cannot read" in out.stderr and "a_1" in out.stderr
    assert steps["after_good"] == [3, 3]
    assert steps["rejected"] == 3
