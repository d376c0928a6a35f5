"""``loadgen run --web``: the URL is printed, nothing runs until the form starts it, each run's end
gives its verdict and report in the UI, a second run starts from the same page, and the process
exits with the last run's verdict.
"""

from __future__ import annotations

import signal
import subprocess
import time

import orjson
import pytest
import requests

from tests.conftest import free_port

from .runs import LOADGEN, records, sim, truth


def _wait(predicate, timeout_s: float, what: str, proc: subprocess.Popen, err_path):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        assert proc.poll() is None, f"loadgen exited ({proc.returncode}): {err_path.read_text()[-3000:]}"
        try:
            value = predicate()
        except (requests.ConnectionError, FileNotFoundError, orjson.JSONDecodeError):
            value = None
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}: {err_path.read_text()[-3000:]}")


def test_web_waits_for_the_form_shows_each_verdict_and_report_and_exits_with_the_last(tmp_path) -> None:
    results = tmp_path / "results"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    err_path = tmp_path / "stderr.txt"
    with sim(tmp_path, "--profile", "tiny", "--seed", "2") as (server, truth_log), err_path.open("w") as err:
        proc = subprocess.Popen(
            [*LOADGEN, "run", "--web", "--web-port", str(port), "--target", server.url, "--workload", "tiny",
             "--results", str(results), "--max-schedule-lag", "60s"],
            stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip
        try:
            _wait(lambda: f"web UI at {base}" in err_path.read_text(), 60, "the URL", proc, err_path)
            _wait(lambda: requests.get(f"{base}/stats/requests", timeout=5).ok, 60, "the UI", proc, err_path)
            # Waiting for the form: no run has started, none has been written.
            assert requests.get(f"{base}/stats/requests", timeout=5).json()["state"] == "ready"
            assert requests.get(f"{base}/loadgen/live.json", timeout=5).json()["verdict"]["state"] == "waiting"
            assert not results.exists() or not any(results.iterdir())
            assert requests.get(f"{base}/loadgen/report", timeout=5).status_code == 404
            # and no request but the preflight's reached the server
            assert all(rid.startswith("loadgen-preflight-") for rid in truth(truth_log))

            form = {"user_count": "1", "spawn_rate": "1", "host": server.url, "workload": "tiny", "rate": "20",
                    "num_sessions": "8", "run_id": "first", "max_schedule_lag": "60s"}  # fmt: skip
            assert requests.post(f"{base}/swarm", data=form, timeout=10).json()["success"]
            live = _wait(lambda: requests.get(f"{base}/loadgen/live.json", timeout=5).json()["final"], 60,
                         "the first run's verdict", proc, err_path)  # fmt: skip
            assert live == {"verdict": live["verdict"], "exit_code": 0, "report": "/loadgen/report/first"}
            assert live["verdict"].startswith("loadgen verdict: PASS: ")
            page = requests.get(f"{base}/loadgen/report/first", timeout=10)
            assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
            assert page.content == (results / "first" / "report.html").read_bytes()
            assert (results / "first" / "summary.json").exists()
            served = [rid for rid in truth(truth_log) if rid.startswith("first-")]
            assert len(records(results / "first")) == len(served) >= 8
            tab = {r["key"]: r["value"] for r in requests.get(f"{base}/loadgen/live.json", timeout=5).json()["run"]}
            assert tab["verdict"].startswith("PASS: ") and tab["report"] == "/loadgen/report/first"

            # The next run from the same page: an SLO it cannot meet, so its verdict is exit 3.
            form2 = {**form, "run_id": "second", "slo": "ttft_p50=1us"}
            assert requests.post(f"{base}/swarm", data=form2, timeout=10).json()["success"]
            second = _wait(lambda: (f := requests.get(f"{base}/loadgen/live.json", timeout=5).json()["final"])
                           and f["report"] == "/loadgen/report/second" and f, 60, "the second run's verdict",
                           proc, err_path)  # fmt: skip
            assert second["exit_code"] == 3 and "SLO missed" in second["verdict"]
            assert requests.get(f"{base}/loadgen/report", timeout=10).content == (
                results / "second" / "report.html"
            ).read_bytes()  # the last run's
            assert requests.get(f"{base}/loadgen/report/first", timeout=10).status_code == 200
            assert requests.get(f"{base}/loadgen/report/..%2Frun.json", timeout=10).status_code == 404

            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=60) == 3, err_path.read_text()[-3000:]
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    stderr = err_path.read_text()
    assert "Traceback" not in stderr, stderr[-3000:]
    assert stderr.count("loadgen verdict: PASS") == 1 and "report: " in stderr
    assert stderr.rstrip().splitlines()[-1].startswith("loadgen verdict: FAIL (exit 3): SLO missed")


@pytest.mark.parametrize("flags", [["--autostart"]])
def test_autostart_without_web_is_a_usage_error(flags) -> None:
    out = subprocess.run([*LOADGEN, "run", *flags, "--workload", "tiny"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1] == (
        "Error: --autostart starts a --web run at once; without --web a run always starts at once"
    )


def test_a_start_before_any_worker_joined_waits_for_one_or_says_none_came(tmp_path) -> None:
    # Locust's master, asked to start with no worker joined, logs a warning and starts nothing
    # while the form's answer says it started: a run that never comes.
    import threading

    results = tmp_path / "results"
    port, master_port = free_port(), free_port()
    base = f"http://127.0.0.1:{port}"
    err_path = tmp_path / "stderr.txt"
    worker = None
    with sim(tmp_path, "--profile", "tiny", "--seed", "2") as (server, truth_log), err_path.open("w") as err:
        proc = subprocess.Popen(
            [*LOADGEN, "master", "--web-port", str(port), "--master-port", str(master_port),
             "--expect-workers", "1", "--target", server.url, "--workload", "tiny", "--results", str(results),
             "--max-schedule-lag", "60s"],
            stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip
        try:
            _wait(lambda: requests.get(f"{base}/stats/requests", timeout=5).ok, 60, "the UI", proc, err_path)
            form = {"user_count": "1", "spawn_rate": "1", "host": server.url, "workload": "tiny", "rate": "20",
                    "num_sessions": "4", "run_id": "alone", "max_schedule_lag": "60s"}  # fmt: skip
            t = time.monotonic()
            answer = requests.post(f"{base}/swarm", data=form, timeout=30).json()
            assert answer["success"] is False and "no worker has joined" in answer["message"], answer
            assert time.monotonic() - t >= 4.5  # it waited for one first
            assert not any(rid.startswith("alone-") for rid in truth(truth_log))

            # A start that comes first and a worker that joins a moment later: the run happens.
            got: dict = {}
            form = {**form, "run_id": "joined"}
            poster = threading.Thread(
                target=lambda: got.update(requests.post(f"{base}/swarm", data=form, timeout=30).json())
            )
            poster.start()
            time.sleep(0.5)
            worker = subprocess.Popen(
                [*LOADGEN, "worker", "--master-host", "127.0.0.1", "--master-port", str(master_port)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            poster.join(timeout=40)
            assert got.get("success") is True, got
            live = _wait(lambda: requests.get(f"{base}/loadgen/live.json", timeout=5).json()["final"], 60,
                         "the run's verdict", proc, err_path)  # fmt: skip
            assert live["exit_code"] == 0 and live["report"] == "/loadgen/report/joined", live
            served = [rid for rid in truth(truth_log) if rid.startswith("joined-")]
            assert len(records(results / "joined")) == len(served) >= 4
        finally:
            for p in (worker, proc):
                if p is not None and p.poll() is None:
                    p.kill()
                    p.wait(timeout=10)
    assert "Traceback" not in err_path.read_text()
