"""The master's /metrics endpoint in a real `loadgen run` (master + worker process, embedded sim).

Scraped throughout the run and parsed with prometheus_client's parser. The final scrape (during
``--prometheus-linger``) must equal ``metrics.prom`` byte for byte, and its numbers must equal the
run's own files: counts, errors and tokens those of summary.json; every histogram bucket the
number of raw values in requests.jsonl at or below its ``le``; every ``_sum`` their exact sum.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from analysis.hlog import clamp_us
from analysis.records import metric_values, tag_label
from loadgen.cli import main
from loadgen.commands.run import LOCUSTFILE
from loadgen.live.prometheus import HISTOGRAMS
from tests.conftest import free_port

from .runs import LOADGEN, records, run_dir

LABELS = ("turn_class", "tenant", "target")


def _scrape(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as resp:
            assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            return resp.read().decode()
    except OSError:
        return None  # not up yet, or already gone


def _families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _quick(text: str, pattern: re.Pattern) -> float:
    """A sum over matching samples without the full parse (~40 ms a scrape, left for after the run)."""
    return sum(float(v) for v in pattern.findall(text))


END_TIME = re.compile(r"^loadgen_run_end_time_seconds (\S+)$", re.M)
REQUESTS = re.compile(r"^loadgen_requests_total\{[^}]*\} (\S+)$", re.M)


def _total(fams: dict, name: str, **match: str) -> float:
    fam = fams.get(name)
    if fam is None:
        return 0.0
    return sum(
        s.value
        for s in fam.samples
        if s.name in (name, name + "_total") and all(s.labels.get(k) == v for k, v in match.items())
    )


def _counts(fams: dict, metric: str) -> float:
    name = HISTOGRAMS[metric][0]
    return sum(s.value for s in fams[name].samples if s.name == name + "_count") if name in fams else 0.0


@pytest.mark.slow  # ~10 s: the sim and Locust start, the run lasts 2.75 s, the endpoint lingers 1 s
def test_live_scrapes_and_the_final_state_equal_the_results(tmp_path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    results = tmp_path / "results"
    cmd = [
        # Constant arrivals: the run lasts at least 2.75 s by construction (the 12th session starts
        # then), far longer than the endpoint's 1 s cache plus the workers' 0.5 s report interval.
        *LOADGEN, "run", "--workload", "tiny", "--arrival", "constant", "--rate", "4", "--num-sessions", "12", "--seed", "5",
        "--profile", "tiny", "--results", str(results), "--max-schedule-lag", "10s",
        "--prometheus-port", str(port), "--prometheus-linger", "1s",
    ]  # fmt: skip
    stderr = (tmp_path / "stderr.txt").open("w+")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=stderr, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    scrapes: list[str] = []
    deadline = time.monotonic() + 90
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            text = _scrape(url)
            if text:  # empty before the run starts
                scrapes.append(text)
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    stderr.seek(0)
    err = stderr.read()
    assert proc.returncode == 0, err[-3000:]

    during = [t for t in scrapes if _quick(t, END_TIME) == 0 and _quick(t, REQUESTS) > 0]
    after = [t for t in scrapes if _quick(t, END_TIME) > 0]
    assert during, f"no scrape saw requests while the run was going ({len(scrapes)} scrapes)"
    assert after, "no scrape saw the final numbers during --prometheus-linger"
    # Counters never go down while the run goes on.
    seen = [_quick(t, REQUESTS) for t in scrapes]
    assert seen == sorted(seen)
    live = _families(during[-1])
    assert 0 < _total(live, "loadgen_requests") == _counts(live, "schedule_lag")

    d = run_dir(results)
    final_text = after[-1]
    final = _families(final_text)
    assert (d / "metrics.prom").read_text() == final_text
    summary = orjson.loads((d / "summary.json").read_bytes())
    assert summary["status"] == "complete"
    (info,) = final["loadgen_run_info"].samples
    assert info.labels["run_id"] == d.name and info.labels["seed"] == "5" and info.labels["workload"] == "tiny"

    # Totals: equal to summary.json.
    assert _total(final, "loadgen_requests") == summary["requests"]["measured"] > 0
    assert _total(final, "loadgen_requests", status="error") == summary["errors"]["total"]
    for category, n in summary["errors"]["by_category"].items():
        assert _total(final, "loadgen_errors", category=category) == n
    assert _total(final, "loadgen_errors") == summary["errors"]["total"]
    assert _total(final, "loadgen_output_tokens") == summary["throughput"]["output_tokens"]
    assert _total(final, "loadgen_input_tokens") == summary["throughput"]["input_tokens"]
    for metric in HISTOGRAMS:
        assert _counts(final, metric) == summary["metrics"][metric]["count"], metric
    for tc, part in summary["by_turn_class"].items():
        assert _total(final, "loadgen_requests", turn_class=tc) == part["requests"]["measured"]
    assert _total(final, "loadgen_sessions_started") == 12
    assert _total(final, "loadgen_sessions_in_flight") == _total(final, "loadgen_requests_in_flight") == 0

    # Buckets and sums: equal to the raw values in requests.jsonl.
    raw: dict[tuple, list[int]] = defaultdict(list)
    for rec in records(d):
        key = tuple(tag_label(x) for x in (rec.turn_class, rec.tenant, rec.target))
        for metric, value in metric_values(rec):
            raw[(metric, *key)].append(value)
    checked = 0
    for metric, (name, _) in HISTOGRAMS.items():
        for s in final[name].samples:
            values = raw[(metric, *(s.labels[k] for k in LABELS))]
            if s.name == name + "_bucket":
                le = s.labels["le"]
                clamped = [clamp_us(v) for v in values]
                expected = len(values) if le == "+Inf" else sum(1 for v in clamped if v <= round(float(le) * 1e6))
                assert s.value == expected, (name, s.labels)
                checked += 1
            elif s.name == name + "_sum":
                assert abs(s.value - sum(values) / 1e6) < 1e-9, (name, s.labels)
    assert checked > 100
    assert "final metrics served at" in err


def _in_use(port: int) -> str:
    return f"Error: --prometheus-port {port}: 127.0.0.1:{port} is in use; choose a free port or stop what listens there"


def test_a_port_in_use_is_a_one_line_error(tmp_path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        # `loadgen run` finds it before starting anything (no sim, no Locust): the only line.
        args = ["run", "--workload", "tiny", "--num-sessions", "1", "--results", str(tmp_path), "--prometheus-port", str(port)]
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 2 and r.stderr.splitlines() == [_in_use(port)], r.output
        assert not list(tmp_path.iterdir())
        # The stock Locust command: the master finds it when it binds, before any load.
        cmd = [
            sys.executable, "-m", "locust", "-f", LOCUSTFILE, "--headless", "-u", "1", "-r", "1",
            "--host", "http://127.0.0.1:9", "--results", str(tmp_path / "locust"), "--loglevel", "WARNING",
            "--prometheus-port", str(port),
        ]  # fmt: skip
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
        assert "Traceback" not in r.stderr and r.stderr.strip().splitlines()[-1] == _in_use(port), r.stderr
        assert not Path(tmp_path / "locust").exists()
