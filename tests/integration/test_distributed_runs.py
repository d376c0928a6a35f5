"""Distributed runs: a master and three workers on 127.0.0.1, checked against the sim's truth log.

Every check compares counts and sets against ground truth (the workload's own sessions, the
sim's record of every request it served, the records' raw fields), never wall-clock guesses:
the merged histograms must equal a rebuild from the records bucket for bucket, every session
must run exactly once, and one seed must give the same sessions whatever the worker count.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson
import psutil
import pytest

from analysis.hlog import clamp_us, new_histogram, read_histograms
from analysis.records import RequestRecord, histogram_tag, metric_values
from tests.conftest import free_port
from workloads import load_workload

from .runs import LOADGEN, loadgen, records, sim, truth

pytestmark = pytest.mark.slow

SEED = 3
# The H200 profile: ~3 ms a token, 1,024 sequences and 4,096 waiting, so no request is ever
# refused (a 429 would make a session incomplete for a reason that is not under test).
H200 = ("--profile", "h200-llama3-8b-fp8")
# The tiny workload's sessions, with agents that think ~0.5 s between turns: a worker then always
# has sessions in flight (about 10 per worker at 20 sessions/s) while the server stays idle.
THINKING_WORKLOAD = """\
name: tiny-thinking
description: The tiny workload with half-second pauses between turns.
system_prompt_tokens: 20
turns: {dist: uniform, low: 2, high: 3}
user_tokens: {dist: uniform, low: 10, high: 30}
output_tokens: 16
think_time: {dist: uniform, low: 400ms, high: 600ms}
"""
# These tests check data (counts, sets, histograms), not timing: a test machine busy with other
# work must not turn a verdict into "generator saturated" (exit 4), which tests of their own cover.
NO_LAG_BOUND = ("--max-schedule-lag", "10s")


def _turns_per_session(seed: int, n: int, workload: str = "tiny") -> dict[int, int]:
    wl = load_workload(workload)
    return {k: len(wl.session(seed, k).turns) for k in range(n)}


def _run_info(run_dir: Path) -> dict:
    return orjson.loads((run_dir / "run.json").read_bytes())


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _assert_histograms_equal_records(run_dir: Path, recs: list[RequestRecord]) -> None:
    """metrics.hlog (the master's exact merge of worker deltas) == a rebuild from requests.jsonl."""
    hists = read_histograms(run_dir / "metrics.hlog")
    rebuilt: dict = {}
    for rec in recs:
        for metric, value in metric_values(rec):
            h = rebuilt.setdefault(histogram_tag(metric, rec.turn_class, rec.tenant, rec.target), new_histogram())
            h.record_value(clamp_us(value))
    assert set(hists) == set(rebuilt)
    for tag, h in rebuilt.items():
        assert list(hists[tag].counts) == list(h.counts), tag


def _assert_every_session_once(run_id: str, recs: list[RequestRecord], sim_truth: dict, turns: dict[int, int]) -> None:
    """Each session's turns are recorded exactly once, none missing, and the sim served each once."""
    seen = Counter((r.session_index, r.turn_index) for r in recs)
    assert [k for k, c in seen.items() if c > 1] == []
    expected = {(k, t) for k, n in turns.items() for t in range(n)}
    assert set(seen) == expected
    assert all(r.ok for r in recs)
    served = {rid: t for rid, t in sim_truth.items() if rid.startswith(f"{run_id}-")}
    assert set(served) == {f"{run_id}-{k}-{t}" for k, t in expected}
    assert all(t["outcome"] == "ok" for t in served.values())
    for r in recs:
        assert r.prompt_tokens == served[r.request_id]["prompt_tokens"], r.request_id


def _assert_partitioned_by_slot(info: dict, recs: list[RequestRecord], n_workers: int) -> None:
    """Session k ran on the worker holding slot k % n (docs/distributed.md)."""
    slot_of = {w["id"]: w["slot"] for w in info["workers"]}
    assert sorted(slot_of.values()) == list(range(n_workers))
    assert {r.worker for r in recs} == set(slot_of)
    assert all(slot_of[r.worker] == r.session_index % n_workers for r in recs)


def _start(args: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [*LOADGEN, *args],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


@contextmanager
def _processes() -> Iterator[list[subprocess.Popen]]:
    """Processes the test starts; whatever is still running at the end is killed."""
    procs: list[subprocess.Popen] = []
    try:
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)


def _master_args(
    url: str, port: int, results: Path, run_id: str, workers: int, *extra: str, workload: str = "tiny"
) -> list[str]:
    return [
        "master", "--headless", "--expect-workers", str(workers), "--master-port", str(port),
        "--target", url, "--workload", workload, "--seed", str(SEED), "--results", str(results),
        "--run-id", run_id, *NO_LAG_BOUND, *extra,
    ]  # fmt: skip


def _worker_args(port: int) -> list[str]:
    return ["worker", "--master-host", "127.0.0.1", "--master-port", str(port)]


def _locust_child(wrapper: subprocess.Popen, timeout_s: float = 30.0) -> int:
    """The pid of the Locust worker process that ``loadgen worker`` runs as its child."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        children = psutil.Process(wrapper.pid).children()
        if children:
            return children[0].pid
        time.sleep(0.05)
    raise AssertionError("loadgen worker started no Locust process")


def _wait_for(predicate, timeout_s: float, what: str):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _started_run(run_dir: Path) -> dict | None:
    """run.json once the master sent its plans (it lists the workers and their slots)."""
    try:
        info = _run_info(run_dir)
    except (FileNotFoundError, orjson.JSONDecodeError):
        return None
    return info if info.get("workers") else None


def _sleep_until_unix(t: float) -> None:
    time.sleep(max(0.0, t - time.time()))


def test_three_workers_merge_exactly_run_every_session_once_and_match_one_worker(tmp_path, capsys) -> None:
    n = 300
    turns = _turns_per_session(SEED, n)
    load = ["--rate", "150", "--num-sessions", str(n)]
    common = ["--workload", "tiny", *load, "--seed", str(SEED), *NO_LAG_BOUND]
    runs: dict[str, tuple[Path, list[RequestRecord]]] = {}
    with sim(tmp_path, *H200, "--seed", "1") as (proc, truth_log):
        for name, workers in (("one", 1), ("three", 3)):
            results = tmp_path / name
            r = loadgen("run", "--target", proc.url, *common, "--workers", str(workers),
                        "--results", str(results), "--run-id", name)  # fmt: skip
            assert r.returncode == 0, r.stderr[-3000:]
            assert _last_line(r.stderr).startswith("loadgen verdict: PASS"), r.stderr[-500:]
            runs[name] = (results / name, records(results / name))

        # The same with a separately started master and three `loadgen worker` processes.
        port, results = free_port(), tmp_path / "mw"
        with _processes() as procs:
            procs.append(_start(_master_args(proc.url, port, results, "mw", 3, *load), tmp_path / "master.log"))
            procs += [_start(_worker_args(port), tmp_path / f"worker{i}.log") for i in range(3)]
            assert procs[0].wait(timeout=120) == 0, (tmp_path / "master.log").read_text()[-3000:]
            assert _last_line((tmp_path / "master.log").read_text()).startswith("loadgen verdict: PASS")
            for w in procs[1:]:  # the master's quit ends its workers
                assert w.wait(timeout=30) in (0, 1), (tmp_path / "worker0.log").read_text()[-2000:]
        runs["mw"] = (results / "mw", records(results / "mw"))
    sim_truth = truth(truth_log)

    for name, (run_dir, recs) in runs.items():
        info = _run_info(run_dir)
        assert info["status"] == "complete" and info["lost_workers"] == []
        assert info["requests_recorded"] == len(recs) == sum(turns.values())
        _assert_histograms_equal_records(run_dir, recs)
        _assert_every_session_once(name, recs, sim_truth, turns)
        _assert_partitioned_by_slot(info, recs, 1 if name == "one" else 3)

    # One seed, the same sessions whatever the worker count: ids, prompts (the sim's own count
    # of prompt tokens per session and turn) and the intended start of every first turn.
    def signature(recs: list[RequestRecord]) -> dict:
        return {
            (r.session_id, r.turn_index): (sim_truth[r.request_id]["prompt_tokens"], r.t_sched_us if r.turn_index == 0 else None)
            for r in recs
        }

    one = signature(runs["one"][1])
    assert signature(runs["three"][1]) == one
    assert signature(runs["mw"][1]) == one
    with capsys.disabled():
        print(f"\n[distributed] {n} sessions, {len(one)} requests each with 1, 3 and master + 3 workers: identical")


def test_a_stop_mid_run_loses_no_recorded_request(tmp_path, capsys) -> None:
    # The sim slowed 20x: a request streams for ~1 s, so about 20 requests are on the wire at the
    # stop, and a 0.2 s stop timeout cuts most of them.
    results = tmp_path / "results"
    with sim(tmp_path, *H200, "--time-scale", "20", "--seed", "2") as (proc, truth_log):
        r = loadgen(
            "run", "--target", proc.url, "--workload", "tiny", "--rate", "8", "--duration", "3s",
            "--stop-timeout", "0.2s", "--seed", "2", "--workers", "3", "--results", str(results), "--run-id", "st",
            *NO_LAG_BOUND,
        )  # fmt: skip
        # Requests still on the wire at the drain's deadline make the run incomplete.
        assert r.returncode == 5, r.stderr[-3000:]
        time.sleep(0.3)  # the sim logs a cut request when it notices the closed connection
    assert "recorded as cut_at_stop" in _last_line(r.stderr), _last_line(r.stderr)
    run_dir = results / "st"
    info = _run_info(run_dir)
    recs = records(run_dir)
    served = {rid: t for rid, t in truth(truth_log).items() if rid.startswith("st-")}
    recorded = {r.request_id for r in recs}
    cancelled = info["cancelled_at_stop"]

    assert info["status"] == "complete" and not info.get("missing_final_reports")
    assert info["requests_recorded"] == len(recs) == len(recorded)
    # Every request the sim received is on record: those the stop cut as cut_at_stop, with what
    # had arrived of them.
    assert recorded == set(served)
    cut = [r for r in recs if r.error_category == "cut_at_stop"]
    assert cancelled["requests"] >= 1, "the test needs requests on the wire at the stop"
    assert len(cut) == cancelled["requests"] == info["accounting"]["outcomes"]["cut_at_stop"]
    assert all(served[r.request_id]["outcome"] in ("client_disconnected", "ok") for r in cut)
    assert all(r.t_end_us >= r.t_send_us and r.chunks == len(r.itl_us) + (1 if r.chunks else 0) for r in cut)
    assert cancelled["sessions"] >= cancelled["requests"]
    unrecorded = set(served) - recorded
    # The sessions the stop cut short are incomplete in the records, never half-missing elsewhere.
    by_session = Counter(r.session_index for r in recs)
    turns = _turns_per_session(2, max(by_session) + 1)
    assert all(c <= turns[k] for k, c in by_session.items())
    with capsys.disabled():
        print(
            f"\n[stop] {len(recs)} recorded, {len(served)} served by the sim, {len(unrecorded)} cut by the stop; "
            f"cancelled_at_stop {cancelled}"
        )


def test_a_worker_killed_mid_run_is_reported_and_the_others_data_is_complete(tmp_path, capsys) -> None:
    # 120 sessions arrive over ~2 s and last ~1 s; one worker is SIGKILLed 1 s in. The other two
    # finish their sessions (by ~3.5 s) before the master can notice the loss (3 missed
    # heartbeats, >= 4 s): the run must still end, by itself, as soon as it does.
    n, port, results = 120, free_port(), tmp_path / "results"
    workload = tmp_path / "tiny-thinking.yaml"
    workload.write_text(THINKING_WORKLOAD)
    turns = _turns_per_session(SEED, n, str(workload))
    with sim(tmp_path, *H200, "--seed", "1") as (proc, truth_log), _processes() as procs:
        master_log = tmp_path / "master.log"
        args = _master_args(proc.url, port, results, "k", 3, "--rate", "60", "--num-sessions", str(n), workload=str(workload))
        procs.append(_start(args, master_log))
        workers = [_start(_worker_args(port), tmp_path / f"worker{i}.log") for i in range(3)]
        procs += workers
        info = _wait_for(lambda: _started_run(results / "k"), 60, "the run to start")
        victim = _locust_child(workers[0])
        _sleep_until_unix(info["t0_unix_s"] + 1.0)
        os.kill(victim, signal.SIGKILL)
        # Its sessions in flight died with it, and its arrivals due before the loss was noticed
        # were never sent: the run is incomplete, and says why.
        assert procs[0].wait(timeout=60) == 5, master_log.read_text()[-3000:]
        out = master_log.read_text()
    sim_truth = truth(truth_log)
    run_dir = results / "k"
    info = _run_info(run_dir)
    recs = records(run_dir)

    assert info["status"] == "complete"
    [lost] = info["lost_workers"]
    assert lost["pid"] == victim
    slot_of = {w["id"]: w["slot"] for w in info["workers"]}
    assert lost["worker"] in slot_of and lost["slot"] == slot_of[lost["worker"]]
    # The summary and the verdict say so.
    assert "1 worker(s) were lost" in out
    assert _last_line(out).startswith("loadgen verdict: FAIL (exit 5): run incomplete: 1 worker lost (slot"), _last_line(out)
    assert "sessions in flight, whose unreported requests are missing" in _last_line(out)
    acc = info["accounting"]
    assert acc["arrivals_planned"] == n
    assert acc["sessions_started"] + acc["sessions_not_started"].get("worker lost", 0) == n
    assert acc["requests_sent"] == len(recs)

    by_session: dict[int, list[RequestRecord]] = {}
    for r in recs:
        by_session.setdefault(r.session_index, []).append(r)
    assert info["requests_recorded"] == len(recs) == len({r.request_id for r in recs})
    _assert_histograms_equal_records(run_dir, recs)
    # The surviving slots: every session complete, and everything the sim served for them recorded.
    for k in range(n):
        if k % 3 == lost["slot"]:
            continue
        assert sorted(r.turn_index for r in by_session.get(k, [])) == list(range(turns[k])), k
        assert all(r.ok for r in by_session[k])
    served_survivors = {rid for rid in sim_truth if rid.startswith("k-") and int(rid.split("-")[1]) % 3 != lost["slot"]}
    assert served_survivors == {r.request_id for r in recs if r.session_index % 3 != lost["slot"]}
    # The lost slot: the sessions named as in flight belong to it and are incomplete in the records.
    assert lost["in_flight_sessions"], "the victim was killed with sessions in flight"
    wl = load_workload(str(workload))
    ids = {wl.session(SEED, k).session_id: k for k in range(n)}
    for sid in lost["in_flight_sessions"]:
        k = ids[sid]
        assert k % 3 == lost["slot"]
        assert len(by_session.get(k, [])) < turns[k]
    assert all(r.worker != lost["worker"] or r.session_index % 3 == lost["slot"] for r in recs)
    survivors_end_s = max(r.t_end_us for r in recs if r.session_index % 3 != lost["slot"]) / 1e6
    with capsys.disabled():
        print(
            f"\n[worker lost] killed at 1.0 s, noticed at {lost['lost_at_s']} s with "
            f"{len(lost['in_flight_sessions'])} sessions in flight; the others finished at {survivors_end_s:.2f} s"
        )


def test_a_lost_workers_arrivals_are_re_planned_onto_the_survivors(tmp_path, capsys) -> None:
    # 300 sessions at 30/s: arrivals go on for ~10 s, well past the loss being noticed (~4-5 s).
    # The survivor sends the lost slot's arrivals from then on, each session once, as the same
    # session (k stays k); those due between the kill and the re-plan are counted as not started.
    n, port, results = 300, free_port(), tmp_path / "results"
    turns = _turns_per_session(SEED, n)
    with sim(tmp_path, *H200, "--seed", "1") as (proc, truth_log), _processes() as procs:
        master_log = tmp_path / "master.log"
        procs.append(_start(_master_args(proc.url, port, results, "rp", 2, "--rate", "30", "--num-sessions", str(n)), master_log))
        workers = [_start(_worker_args(port), tmp_path / f"worker{i}.log") for i in range(2)]
        procs += workers
        info = _wait_for(lambda: _started_run(results / "rp"), 60, "the run to start")
        victim = _locust_child(workers[0])
        _sleep_until_unix(info["t0_unix_s"] + 1.0)
        os.kill(victim, signal.SIGKILL)
        assert procs[0].wait(timeout=60) == 5, master_log.read_text()[-3000:]
    run_dir = results / "rp"
    info = _run_info(run_dir)
    recs = records(run_dir)
    sim_truth = truth(truth_log)
    [lost] = info["lost_workers"]
    [survivor] = lost["replanned_onto"]
    slot, from_s = lost["slot"], lost["arrivals_from_s"]
    by_session: dict[int, list[RequestRecord]] = {}
    for r in recs:
        by_session.setdefault(r.session_index, []).append(r)
    first_turn_s = {k: min(r.t_sched_us for r in rs) / 1e6 for k, rs in by_session.items()}
    adopted = [k for k in by_session if k % 2 == slot and first_turn_s[k] >= from_s]
    assert adopted, "the survivor sent none of the lost slot's arrivals"
    assert all({r.worker for r in by_session[k]} == {survivor} for k in adopted)
    assert all(sorted(r.turn_index for r in by_session[k]) == list(range(turns[k])) for k in adopted)
    # The same sessions as a run without the loss: the first turn of session k at its own time.
    from loadgen.config import RunConfig
    from loadgen.engine.driver import global_schedule

    cfg = RunConfig.from_dict(info["config"])
    offsets = global_schedule(cfg, load_workload("tiny")).offsets
    assert all(abs(first_turn_s[k] - offsets[k]) < 1e-5 for k in adopted)
    assert len({r.request_id for r in recs}) == len(recs)
    assert {r.request_id for r in recs} <= {rid for rid in sim_truth if rid.startswith("rp-")}
    acc = info["accounting"]
    not_started = acc["sessions_not_started"].get("worker lost", 0)
    assert acc["sessions_started"] + not_started == n and not_started > 0
    lost_slot_due_in_gap = sum(1 for k in range(slot, n, 2) if offsets[k] < from_s and k not in by_session)
    assert not_started <= lost_slot_due_in_gap
    with capsys.disabled():
        print(
            f"\n[re-plan] lost at {lost['lost_at_s']} s; the survivor sent {len(adopted)} of its sessions from "
            f"{from_s} s; {not_started} came due before and were not started"
        )


def test_a_late_worker_stands_by_and_takes_over_a_lost_workers_slot(tmp_path, capsys) -> None:
    # The master expects 2 workers; a third joins after the start. No slot is free, so it stands
    # by; when a worker is then SIGKILLed, the standby takes over its slot and sends its arrivals.
    # 480 sessions at 40/s: arrivals go on for 12 s, well past the loss being noticed (~4 s).
    n, port, results = 480, free_port(), tmp_path / "results"
    turns = _turns_per_session(SEED, n)
    with sim(tmp_path, *H200, "--seed", "1") as (proc, truth_log), _processes() as procs:
        master_log = tmp_path / "master.log"
        procs.append(_start(_master_args(proc.url, port, results, "late", 2, "--rate", "40", "--num-sessions", str(n)), master_log))
        workers = [_start(_worker_args(port), tmp_path / f"worker{i}.log") for i in range(2)]
        procs += workers
        _wait_for(lambda: _started_run(results / "late"), 60, "the run to start")
        procs.append(_start(_worker_args(port), tmp_path / "late.log"))
        info = _wait_for(lambda: (i := _run_info(results / "late")).get("standby_workers") and i, 30, "a standby")
        [standby] = info["standby_workers"]
        victim = _locust_child(workers[0])
        os.kill(victim, signal.SIGKILL)
        # What the victim had in flight is lost with it: the run is incomplete (exit 5).
        assert procs[0].wait(timeout=60) == 5, master_log.read_text()[-3000:]
    run_dir = results / "late"
    info = _run_info(run_dir)
    recs = records(run_dir)
    sim_truth = truth(truth_log)

    [lost] = info["lost_workers"]
    assert lost["pid"] == victim and lost["replaced_by"] == standby
    slot, start_s = lost["slot"], lost["arrivals_from_s"]
    assert lost["lost_at_s"] <= start_s, lost
    taken = [r for r in recs if r.worker == standby]
    assert taken, "the standby sent nothing"
    assert all(r.session_index % 2 == slot for r in taken)
    # Every session of the lost slot that arrived after the takeover is complete and was sent by
    # the standby; the other slot is complete from start to end.
    by_session: dict[int, list[RequestRecord]] = {}
    for r in recs:
        by_session.setdefault(r.session_index, []).append(r)
    first_turn_s = {k: rs[0].t_sched_us / 1e6 for k, rs in by_session.items() for rs in [sorted(rs, key=lambda r: r.turn_index)]}
    for k in range(n):
        if k % 2 != slot:
            assert sorted(r.turn_index for r in by_session.get(k, [])) == list(range(turns[k])), k
    after = [k for k in by_session if k % 2 == slot and first_turn_s[k] >= start_s]
    assert after and all(sorted(r.turn_index for r in by_session[k]) == list(range(turns[k])) for k in after)
    assert all({r.worker for r in by_session[k]} == {standby} for k in after)
    assert all(sim_truth[r.request_id]["outcome"] == "ok" for r in recs)
    assert len({r.request_id for r in recs}) == len(recs) == info["requests_recorded"]
    with capsys.disabled():
        print(
            f"\n[late worker] lost at {lost['lost_at_s']} s, taken over at {lost['replaced_at_s']} s; "
            f"the standby ran {len(after)} sessions ({len(taken)} requests) from {start_s} s"
        )


def test_a_headless_master_whose_every_worker_is_lost_ends_with_exit_5(tmp_path) -> None:
    # Locust stops the test when its last worker goes missing; a headless master must then quit
    # by itself (not wait for a signal) and say that the generator failed.
    port, results = free_port(), tmp_path / "results"
    with sim(tmp_path, *H200, "--seed", "1") as (proc, _), _processes() as procs:
        master_log = tmp_path / "master.log"
        procs.append(_start(_master_args(proc.url, port, results, "gone", 1, "--rate", "30", "--num-sessions", "300"), master_log))
        worker = _start(_worker_args(port), tmp_path / "worker.log")
        procs.append(worker)
        info = _wait_for(lambda: _started_run(results / "gone"), 60, "the run to start")
        victim = _locust_child(worker)
        _sleep_until_unix(info["t0_unix_s"] + 0.5)
        os.kill(victim, signal.SIGKILL)
        assert procs[0].wait(timeout=60) == 5, master_log.read_text()[-3000:]
        out = master_log.read_text()
    info = _run_info(results / "gone")
    assert info["status"] == "aborted" and info["abort_reason"] == "every worker was lost"
    assert [w["pid"] for w in info["lost_workers"]] == [victim]
    assert _last_line(out).startswith("loadgen verdict: FAIL (exit 5): run incomplete: every worker was lost")
    assert len(records(results / "gone")) == info["requests_recorded"]
