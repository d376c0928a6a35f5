"""Exit codes of a headless run, with the verdict as the last line on stderr (docs/distributed.md).

0 pass, 1 request failures, 2 usage error, 3 an SLO missed, 4 the generator saturated. Each case
is made certain by construction rather than by timing: an SLO of 1 µs cannot be met, a
schedule-lag bound of 1 µs cannot hold, and where saturation is not the subject the bound is
10 s, so a test machine busy with other work cannot turn the verdict into exit 4.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from loadgen.commands.run import LOCUSTFILE

from .runs import loadgen, sim

NO_LAG_BOUND = ("--max-schedule-lag", "10s")


def _run(url: str, results, *extra: str) -> subprocess.CompletedProcess:
    return loadgen(
        "run", "--target", url, "--workload", "tiny", "--rate", "50", "--num-sessions", "6", "--seed", "1",
        "--results", str(results), *extra,
    )  # fmt: skip


def _verdict(r: subprocess.CompletedProcess) -> str:
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert lines, r.stdout[-2000:]
    return lines[-1]


@pytest.mark.slow
def test_exit_codes_0_3_and_4_with_the_verdict_last(tmp_path) -> None:
    with sim(tmp_path, "--profile", "tiny", "--seed", "1") as (proc, _):
        ok = _run(proc.url, tmp_path / "ok", "--slo", "ttft_p99=10s", *NO_LAG_BOUND)
        slo = _run(proc.url, tmp_path / "slo", "--slo", "ttft_p99=1us,itl_p99=10s", *NO_LAG_BOUND)
        sat = _run(proc.url, tmp_path / "sat", "--slo", "ttft_p99=1us", "--max-schedule-lag", "1us")

    assert ok.returncode == 0, ok.stderr[-2000:]
    assert _verdict(ok).startswith("loadgen verdict: PASS: ")
    assert "no failures; SLOs met: ttft_p99" in _verdict(ok)

    assert slo.returncode == 3, slo.stderr[-2000:]
    assert _verdict(slo).startswith("loadgen verdict: FAIL (exit 3): SLO missed: ttft_p99")
    assert "itl_p99" not in _verdict(slo)  # only the missed SLO is named

    # Saturation wins over a missed SLO: the latencies themselves are not to be trusted.
    assert sat.returncode == 4, sat.stderr[-2000:]
    assert _verdict(sat).startswith("loadgen verdict: FAIL (exit 4): generator saturated: schedule-lag p99")
    assert "SLO" not in _verdict(sat)


@pytest.mark.slow
def test_exit_code_1_for_request_failures(tmp_path) -> None:
    # The sim's fault draws are seeded: with seed 2 the first request (loadgen's preflight) is
    # served and 8 of the next 19 get a 500.
    with sim(tmp_path, "--profile", "tiny", "--seed", "2", "--fault-http-500", "0.3") as (proc, _):
        r = _run(proc.url, tmp_path / "results", *NO_LAG_BOUND)
    assert r.returncode == 1, r.stderr[-2000:]
    assert _verdict(r).startswith("loadgen verdict: FAIL (exit 1): ")
    assert "requests failed (http_5xx " in _verdict(r)


def test_exit_code_2_for_usage_errors(tmp_path) -> None:
    r = loadgen("run", "--rate", "fast", "--results", str(tmp_path))
    assert r.returncode == 2
    assert "Error: --rate: 'fast' is not a rate" in r.stderr and "Traceback" not in r.stderr

    # The stock Locust command with loadgen's locustfile: the error is found inside Locust,
    # before any load, and still ends with one verdict line and exit 2.
    cmd = [
        sys.executable, "-m", "locust", "-f", LOCUSTFILE, "--headless", "-u", "1", "-r", "1",
        "--host", "ftp://127.0.0.1:9", "--results", str(tmp_path / "results"), "--loglevel", "WARNING",
    ]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert r.returncode == 2, r.stderr[-2000:]
    assert _verdict(r) == "loadgen verdict: FAIL (exit 2): --host 'ftp://127.0.0.1:9' is not an http(s) URL; use e.g. http://127.0.0.1:8000"
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "results").exists()
