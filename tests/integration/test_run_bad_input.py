"""Bad input to `loadgen run`: one line on stderr, exit 2, and no load sent."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.conftest import free_port

from .runs import loadgen


class _Server:
    """A real HTTP server on 127.0.0.1 that answers every request the same way and counts them."""

    def __init__(self, status: int, content_type: str, body: bytes) -> None:
        outer = self
        self.posts = 0

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self._answer()

            def do_POST(self) -> None:
                outer.posts += 1
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._answer()

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _assert_one_line_usage_error(r, *needles: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    err_lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(err_lines) == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert err_lines[0].startswith("Error: ")
    for n in needles:
        assert n in err_lines[0], err_lines[0]


def test_unreachable_target(tmp_path) -> None:
    port = free_port()  # nothing listens here
    r = loadgen("run", "--target", f"http://127.0.0.1:{port}", "--workload", "tiny", "--num-sessions", "3", "--results", str(tmp_path))
    _assert_one_line_usage_error(r, f"127.0.0.1:{port}")
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("status", "ctype", "body", "needle"),
    [
        (404, "application/json", b'{"detail": "Not Found"}', "404"),
        (200, "application/json", b'{"id": "x", "choices": []}', "text/event-stream"),
        (200, "text/html", b"<html>welcome</html>", "text/event-stream"),
    ],
    ids=["404", "json-not-sse", "html"],
)
def test_target_that_does_not_stream(tmp_path, status, ctype, body, needle) -> None:
    srv = _Server(status, ctype, body)
    try:
        r = loadgen("run", "--target", srv.url, "--workload", "tiny", "--num-sessions", "3", "--results", str(tmp_path))
    finally:
        srv.close()
    _assert_one_line_usage_error(r, srv.url.split("//")[1])
    assert needle in r.stderr or str(status) in r.stderr
    assert srv.posts <= 1  # the one preflight request, never load
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("content", "needles"),
    [
        ("name: bad\nturns: 3\nuser_tokens: 10\noutput_tokens: 8\nthink_tim: 1s\n", ["think_tim", "bad.yaml"]),
        ("name: bad\nturns: -3\nuser_tokens: 10\noutput_tokens: 8\n", ["turns", "bad.yaml"]),
        ("name: bad\nturns: 3\nuser_tokens: {dist: weibull, mean: 3}\noutput_tokens: 8\n", ["weibull", "bad.yaml"]),
        ("name: bad\nturns: 3\nuser_tokens: 10\n", ["output_tokens", "bad.yaml"]),
    ],
    ids=["unknown-key", "negative", "unknown-distribution", "missing-field"],
)
def test_malformed_workload_file(tmp_path, content, needles) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text(content)
    results = tmp_path / "results"
    r = loadgen("run", "--workload", str(spec), "--num-sessions", "3", "--results", str(results))
    _assert_one_line_usage_error(r, *needles)
    assert not results.exists()


def test_malformed_session_file_names_the_line(tmp_path) -> None:
    f = tmp_path / "sessions.jsonl"
    f.write_text('{"id": "a", "turns": [{"tokens": 5, "max_tokens": 4}]}\n{"id": "b", "turns": [{"tokens": 5}]}\n')
    r = loadgen("run", "--workload", str(f), "--results", str(tmp_path / "results"))
    _assert_one_line_usage_error(r, "sessions.jsonl line 2", "max_tokens")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--rate", "fast"], "'fast' is not a rate"),
        (["--duration", "ten"], "'ten' is not a duration"),
        (["--slo", "ttft_p99=quick"], "--slo"),
        (["--adapter", "grpc"], "grpc"),
        (["--router", "nginx:round_robin", "--replicas", "2"], "nginx"),
        (["--workload", "no-such-spec"], "no-such-spec"),
    ],
)
def test_bad_flags(tmp_path, args, needle) -> None:
    r = loadgen("run", *args, "--results", str(tmp_path / "results"))
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert needle in r.stderr


@pytest.mark.parametrize("scale", ["0", "-1", "nan"])
def test_a_trace_time_scale_that_is_no_positive_number_stops_before_any_load(tmp_path, scale) -> None:
    # It once printed a traceback inside Locust, then "complete" and "PASS: 0 requests" (exit 0).
    server = _Server(200, "application/json", b"{}")
    try:
        mooncake = Path(__file__).resolve().parent.parent / "fixtures" / "datasets" / "mooncake.jsonl"
        r = loadgen(
            "run", "--target", server.url, "--workload", str(mooncake), "--trace-time-scale", scale,
            "--results", str(tmp_path / "results"), timeout_s=60,
        )  # fmt: skip
        _assert_one_line_usage_error(r, f"--trace-time-scale {float(scale):g}: must be a number above 0")
        assert server.posts == 0
    finally:
        server.close()


def test_more_sessions_than_a_trace_holds_stops_before_any_load(tmp_path) -> None:
    server = _Server(200, "application/json", b"{}")
    try:
        mooncake = Path(__file__).resolve().parent.parent / "fixtures" / "datasets" / "mooncake.jsonl"
        r = loadgen(
            "run", "--target", server.url, "--workload", str(mooncake), "--num-sessions", "20000",
            "--results", str(tmp_path / "results"), timeout_s=60,
        )  # fmt: skip
        _assert_one_line_usage_error(r, "--num-sessions 20000:", "holds only 240 sessions")
        assert server.posts == 0
    finally:
        server.close()


def test_a_usage_error_inside_the_locust_process_is_said_once_and_sends_nothing(tmp_path) -> None:
    """The stock ``locust -f`` path validates in the Locust process itself: the message is one
    ``Error:`` line plus the verdict line that ends every run, not a log record of it as well."""
    import subprocess
    import sys

    from loadgen.commands.run import LOCUSTFILE

    server = _Server(200, "text/event-stream", b"data: [DONE]\n\n")
    try:
        r = subprocess.run(
            [sys.executable, "-m", "locust", "-f", LOCUSTFILE, "--headless", "--host", server.url,
             "--rate", "fast", "--results", str(tmp_path), "--loglevel", "WARNING"],
            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    finally:
        server.close()
    assert r.returncode == 2, r.stderr[-2000:]
    said = [line for line in r.stderr.splitlines() if "'fast' is not a rate" in line]
    assert len(said) == 2, said
    assert said[0].startswith("Error: --rate: ") and said[1].startswith("loadgen verdict: FAIL (exit 2): --rate: ")
    assert "Traceback" not in r.stderr and server.posts == 0
