"""Open loop holds: arrivals keep the asked rate however slow the server is."""

from __future__ import annotations

import orjson
import pytest

from .runs import loadgen, percentile, records, run_dir, sim, truth

pytestmark = pytest.mark.slow

RATE_PER_S = 20.0
DURATION_S = 6.0  # 120 constant arrivals: one more or less moves the rate by 0.8%


def test_session_arrival_rate_holds_when_sessions_outlast_the_gaps_by_far(tmp_path) -> None:
    results = tmp_path / "results"
    # The H200 profile 20x slower: a 16-token reply takes ~0.75 s, a session of 2-3 turns ~1.5-2.5
    # s, i.e. 30-50x the 0.05 s between arrivals. A closed-loop generator would fall behind here.
    # Each session connects and closes its own connection (--connections per-session), the
    # heavier way for the generator: the rate holds all the same.
    with sim(tmp_path, "--profile", "h200-llama3-8b-fp8", "--time-scale", "20", "--seed", "4") as (proc, truth_log):
        r = loadgen(
            "run", "--target", proc.url, "--workload", "tiny", "--arrival", "constant",
            "--rate", str(RATE_PER_S), "--duration", f"{DURATION_S:g}s", "--seed", "4",
            "--results", str(results), "--stop-timeout", "30s", "--connections", "per-session",
            timeout_s=DURATION_S + 120,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr[-3000:]
    d = run_dir(results)
    recs = records(d)
    first_sends_s = sorted(rec.t_send_us / 1e6 for rec in recs if rec.turn_index == 0)
    achieved = sum(1 for t in first_sends_s if t < DURATION_S) / DURATION_S
    assert abs(achieved - RATE_PER_S) / RATE_PER_S <= 0.05, achieved

    # The server really was slow: many sessions overlapped at once.
    spans = {}
    for rec in recs:
        a, b = spans.get(rec.session_id, (rec.t_send_us, rec.t_end_us))
        spans[rec.session_id] = (min(a, rec.t_send_us), max(b, rec.t_end_us or rec.t_send_us))
    mean_session_s = sum(b - a for a, b in spans.values()) / len(spans) / 1e6
    assert mean_session_s > 10 / RATE_PER_S, mean_session_s  # sessions last > 10 arrival gaps

    lags_ms = [(rec.t_send_us - rec.t_sched_us) / 1000 for rec in recs if rec.turn_index == 0]
    assert percentile(lags_ms, 99) < 10.0

    summary = orjson.loads((d / "summary.json").read_bytes())
    assert summary["mode"] == "open-loop"
    assert not summary["generator"]["saturated"]

    # What the server saw: one connection per session, none carried two sessions.
    t = truth(truth_log)
    ports: dict[str, set[int]] = {}
    for rec in recs:
        ports.setdefault(rec.session_id, set()).add(t[rec.request_id]["client_port"])
    assert all(len(p) == 1 for p in ports.values()), ports
    assert len(set().union(*ports.values())) == len(ports)
    assert orjson.loads((d / "run.json").read_bytes())["connections"] == {
        "mode": "per-session", "opened": len(ports), "handed_on": 0,
    }  # fmt: skip
