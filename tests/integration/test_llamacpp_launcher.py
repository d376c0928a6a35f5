"""The llama-server launcher against the real binary and model, and its process handling.

The tests marked ``llamacpp`` need ``scripts/llama-server.sh ensure`` to have run: they are
skipped when the binary or model is missing, unless ``LOADGEN_REQUIRE_LLAMA`` is set (CI, and
``make test`` after it built them), in which case they fail. The other tests here use a tiny
stand-in server script and run everywhere.

``LOADGEN_UPDATE_FIXTURES=1`` rewrites the transcripts in tests/fixtures/llamacpp/ from the real
server (for adapter unit tests).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from targets.fleet.procs import FleetError, port_in_use
from targets.llamacpp import launcher
from targets.llamacpp.launcher import (
    LlamaServerError,
    build_argv,
    default_threads,
    ensure_llama_server,
    start_llama_servers,
)

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "llamacpp"
SCRIPT = REPO / "scripts" / "llama-server.sh"
HTTP_TIMEOUT = 120.0


def _pid_gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (absent, or a zombie nobody has reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def _wait_gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _pid_gone(pid):
            return True
        time.sleep(0.05)
    return _pid_gone(pid)


# --- the launcher's process handling, with a stand-in server -------------------------------------

FAKE_SERVER = textwrap.dedent(
    """\
    #!{python}
    # Stand-in for llama-server: serves /health on --port; --fail exits at once; --sleep never binds.
    import http.server, sys, time
    args = sys.argv[1:]
    if "--fail" in args:
        print("error: model file is broken", flush=True)
        sys.exit(7)
    if "--sleep" in args:
        time.sleep(3600)
    port = int(args[args.index("--port") + 1])
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b'{{"status":"ok"}}')
        def log_message(self, *a):
            pass
    print("listening", port, flush=True)
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
    """
)


@pytest.fixture
def fake_server(tmp_path: Path) -> tuple[Path, Path]:
    binary = tmp_path / "fake-llama-server"
    binary.write_text(FAKE_SERVER.format(python=sys.executable))
    binary.chmod(0o755)
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF" + bytes(16))
    return binary, model


def test_build_argv_has_the_flags_the_fleet_relies_on() -> None:
    argv = build_argv("/bin/llama-server", "/m.gguf", port=8081, parallel=4, ctx=8192, threads=3)
    joined = " ".join(argv)
    for part in ("--host 127.0.0.1", "--port 8081", "--parallel 4", "--ctx-size 8192", "--threads 3"):
        assert part in joined
    assert "--metrics" in argv and "--slots" in argv
    assert argv[0] == "/bin/llama-server" and argv[argv.index("--model") + 1] == "/m.gguf"


def test_default_threads_splits_the_cores() -> None:
    cores = len(os.sched_getaffinity(0))
    assert default_threads(1) == cores
    assert default_threads(10_000) == 1
    assert default_threads(2) == max(1, cores // 2)


def test_start_and_stop_with_stand_in(fake_server: tuple[Path, Path], tmp_path: Path) -> None:
    binary, model = fake_server
    with start_llama_servers(
        2, binary=binary, model_path=model, threads=1, log_dir=tmp_path / "logs", ready_timeout=20
    ) as fleet:
        assert len(fleet) == 2 and len({r.port for r in fleet}) == 2
        for r in fleet:
            assert r.get_json("/health") == {"status": "ok"}
            assert os.getpgid(r.pid) == r.pid  # own process group
            assert r.log_path.is_file()
        pids, ports = [r.pid for r in fleet], [r.port for r in fleet]
    for pid, port in zip(pids, ports, strict=True):
        assert _pid_gone(pid)
        assert not port_in_use(port)


def test_replica_that_exits_gives_one_line_error_with_log_tail(
    fake_server: tuple[Path, Path], tmp_path: Path
) -> None:
    binary, model = fake_server
    with pytest.raises(FleetError) as info:
        start_llama_servers(
            1, binary=binary, model_path=model, extra_args=["--fail"], ready_timeout=20, log_dir=tmp_path
        )
    message = str(info.value)
    assert "\n" not in message
    assert "exited with code 7" in message and "model file is broken" in message
    assert str(tmp_path / "llama-server-0.log") in message


def test_default_log_dir_is_removed_on_stop(fake_server: tuple[Path, Path]) -> None:
    binary, model = fake_server
    fleet = start_llama_servers(1, binary=binary, model_path=model, threads=1, ready_timeout=20)
    logs = fleet[0].log_path.parent
    assert logs.is_dir()
    fleet.stop()
    assert not logs.exists()


def test_replica_never_healthy_hits_the_deadline_and_is_killed(
    fake_server: tuple[Path, Path], tmp_path: Path
) -> None:
    binary, model = fake_server
    started = time.monotonic()
    with pytest.raises(
        FleetError, match=r"not healthy at http://127\.0\.0\.1:[0-9]+/health within 1\.[0-9]+s"
    ):
        start_llama_servers(
            1, binary=binary, model_path=model, extra_args=["--sleep"], ready_timeout=1.5,
            log_dir=tmp_path,
        )  # fmt: skip
    assert time.monotonic() - started < 15
    # No stand-in may survive the failed start.
    out = subprocess.run(["pgrep", "-f", str(binary)], capture_output=True, text=True, check=False)
    assert out.stdout.strip() == ""


def test_port_taken_before_bind_is_retried_on_another_port(
    fake_server: tuple[Path, Path], tmp_path: Path, monkeypatch
) -> None:
    binary, model = fake_server
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    taken = squatter.getsockname()[1]
    ports = iter([taken])
    real_free_port = launcher.free_port
    monkeypatch.setattr(launcher, "free_port", lambda host: next(ports, None) or real_free_port(host))
    try:
        with start_llama_servers(
            1, binary=binary, model_path=model, threads=1, ready_timeout=20, log_dir=tmp_path
        ) as fleet:
            assert fleet[0].port != taken
            assert fleet[0].get_json("/health") == {"status": "ok"}
    finally:
        squatter.close()


def test_replica_dies_with_its_parent(fake_server: tuple[Path, Path], tmp_path: Path) -> None:
    binary, model = fake_server
    parent_code = textwrap.dedent(
        f"""
        import sys, time
        sys.path.insert(0, {str(REPO)!r})
        from targets.llamacpp.launcher import start_llama_servers
        fleet = start_llama_servers(1, binary={str(binary)!r}, model_path={str(model)!r},
                                    threads=1, ready_timeout=20, log_dir={str(tmp_path)!r})
        print(fleet[0].pid, flush=True)
        time.sleep(60)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True)
    try:
        line = parent.stdout.readline()
        assert line.strip().isdigit(), f"parent printed {line!r}"
        child_pid = int(line)
        assert not _pid_gone(child_pid)
        parent.send_signal(signal.SIGKILL)  # no cleanup code runs in the parent
        parent.wait(timeout=10)
        assert _wait_gone(child_pid), "replica outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_ensure_names_the_command_when_cache_is_empty(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("LOADGEN_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("LLAMA_SERVER_BIN", raising=False)
    monkeypatch.delenv("LLAMA_SERVER_MODEL", raising=False)
    with pytest.raises(LlamaServerError, match=r"run: .*llama-server\.sh ensure"):
        ensure_llama_server()
    assert not (tmp_path / "cache").exists()  # looking does not build or download anything


def test_ensure_honours_explicit_paths(fake_server: tuple[Path, Path], monkeypatch) -> None:
    binary, model = fake_server
    monkeypatch.setenv("LLAMA_SERVER_BIN", str(binary))
    monkeypatch.setenv("LLAMA_SERVER_MODEL", str(model))
    assert ensure_llama_server() == (binary, model)
    monkeypatch.setattr(launcher, "SCRIPT", Path("/nonexistent/llama-server.sh"))
    assert ensure_llama_server() == (binary, model)


# --- the real llama-server -----------------------------------------------------------------------



@pytest.fixture(scope="module")
def fleet(llama_paths: tuple[Path, Path], tmp_path_factory):
    binary, model = llama_paths
    replicas = start_llama_servers(
        2, binary=binary, model_path=model, parallel=2, ctx=4096, threads=1,
        log_dir=tmp_path_factory.mktemp("llama-logs"), ready_timeout=120,
    )  # fmt: skip
    yield replicas
    replicas.stop()


def _get(url: str) -> tuple[int, str, bytes]:
    with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT) as resp:
        return resp.status, resp.headers.get("Content-Type", ""), resp.read()


def _stream(url: str, body: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]]]:
    """POST ``body`` and read the SSE stream: (raw non-empty lines, parsed ``data:`` payloads)."""
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Accept": "text/event-stream"},
    )
    raw, events = [], []
    with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT) as resp:
        assert resp.status == 200
        assert resp.headers.get("Content-Type", "").startswith("text/event-stream")
        for line in resp:
            text = line.decode().rstrip("\r\n")
            if not text:
                continue
            raw.append(text)
            if text.startswith("data: ") and text != "data: [DONE]":
                events.append(json.loads(text[len("data: ") :]))
    return raw, events


def _save(name: str, text: str) -> None:
    if os.environ.get("LOADGEN_UPDATE_FIXTURES"):
        FIXTURES.mkdir(parents=True, exist_ok=True)
        (FIXTURES / name).write_text(text if text.endswith("\n") else text + "\n")


LONG_PROMPT = (
    "You are reviewing a build log from a continuous integration system. "
    + " ".join(
        f"Step {i}: compiled module number {i} of the inference server, linked it, ran its unit tests, "
        f"and archived the artifacts with checksum {i * 7919 % 100003}."
        for i in range(1, 31)
    )
    + " Summarize the log in one sentence:"
)


@pytest.mark.llamacpp
@pytest.mark.slow
def test_real_identity_endpoints(fleet, llama_paths) -> None:
    _, model = llama_paths
    for r in fleet:
        status, _, body = _get(r.url + "/health")
        assert status == 200 and json.loads(body)["status"] == "ok"

        props = r.props()
        assert props["model_path"] == str(model)
        assert props["total_slots"] == 2
        assert props.get("build_info"), "no build_info in /props"

        _, _, body = _get(r.url + "/v1/models")
        models = json.loads(body)
        assert models["data"] and models["data"][0]["id"]
    first = fleet[0]
    _save("props.json", json.dumps(first.props(), indent=2, sort_keys=True))
    _save("models.json", json.dumps(first.get_json("/v1/models"), indent=2, sort_keys=True))
    _save("slots.json", json.dumps(first.get_json("/slots"), indent=2, sort_keys=True))


@pytest.mark.llamacpp
@pytest.mark.slow
def test_real_completion_prefix_cache(fleet) -> None:
    url = fleet[0].url + "/completion"
    body = {
        "prompt": LONG_PROMPT,
        "n_predict": 8,
        "temperature": 0,
        "stream": True,
        "cache_prompt": True,
    }
    raw_cold, cold = _stream(url, body)
    raw_warm, warm = _stream(url, body)
    t_cold, t_warm = cold[-1]["timings"], warm[-1]["timings"]
    assert cold[-1]["stop"] is True and warm[-1]["stop"] is True
    assert t_cold["prompt_n"] > 300, t_cold
    assert t_warm["cache_n"] > 0, t_warm
    assert t_warm["prompt_n"] < t_cold["prompt_n"] / 10, (t_cold, t_warm)
    assert t_warm["prompt_ms"] < t_cold["prompt_ms"] / 5, (t_cold, t_warm)
    assert any(e.get("content") for e in cold[:-1])
    _save("completion_stream_cold.sse", "\n".join(raw_cold))
    _save("completion_stream_cached.sse", "\n".join(raw_warm))


@pytest.mark.llamacpp
@pytest.mark.slow
def test_real_chat_stream_starts_with_role_only_delta(fleet) -> None:
    body = {
        "messages": [
            {"role": "system", "content": "You answer in one short sentence."},
            {"role": "user", "content": "What is a load generator?"},
        ],
        "max_tokens": 12,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    raw, events = _stream(fleet[1].url + "/v1/chat/completions", body)
    assert raw[-1] == "data: [DONE]"
    first = events[0]["choices"][0]["delta"]
    assert first.get("role") == "assistant" and not first.get("content"), first
    text = "".join((e["choices"][0]["delta"].get("content") or "") for e in events if e.get("choices"))
    assert text.strip()
    usage = [e["usage"] for e in events if e.get("usage")]
    assert usage and usage[-1]["completion_tokens"] > 0 and usage[-1]["prompt_tokens"] > 0
    _save("chat_stream.sse", "\n".join(raw))


@pytest.mark.llamacpp
@pytest.mark.slow
def test_real_metrics(fleet) -> None:
    status, ctype, body = _get(fleet[0].url + "/metrics")
    text = body.decode()
    assert status == 200 and ctype.startswith("text/plain")
    names = {line.split()[0] for line in text.splitlines() if line and not line.startswith("#")}
    assert any(n.startswith("llamacpp:") for n in names), names
    assert "llamacpp:prompt_tokens_total" in names
    _save("metrics.txt", text)


@pytest.mark.llamacpp
@pytest.mark.slow
def test_real_alias_and_stop_frees_pids_and_ports(llama_paths, tmp_path: Path) -> None:
    binary, model = llama_paths
    replicas = start_llama_servers(
        2, binary=binary, model_path=model, parallel=1, ctx=512, threads=1, log_dir=tmp_path,
        alias="smollm2-135m",
    )  # fmt: skip
    assert [m["id"] for m in replicas[1].get_json("/v1/models")["data"]] == ["smollm2-135m"]
    pids, ports = [r.pid for r in replicas], [r.port for r in replicas]
    for pid, port in zip(pids, ports, strict=True):
        assert not _pid_gone(pid)
        assert port_in_use(port)
    replicas.stop()
    for pid, port in zip(pids, ports, strict=True):
        assert _pid_gone(pid)
        assert not port_in_use(port)
