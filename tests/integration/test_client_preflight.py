"""Preflight and identity against real servers on 127.0.0.1: every failure is one clear line."""

from __future__ import annotations

import time

import pytest

from loadgen.engine.preflight import preflight
from targets.errors import TargetError
from targets.identity import check_expected, read_identity
from targets.registry import get_adapter
from tests.conftest import free_port
from tests.integration.test_client_stream import start_servers, stop_servers


@pytest.fixture(scope="module")
def servers():
    s = start_servers()
    yield s
    stop_servers(s)


def test_preflight_passes_on_a_streaming_target(servers):
    info = preflight(f"{servers.http}/ok", get_adapter("openai-chat"), model="m", timeout_s=5)
    assert info["status"] == 200 and info["tokens"] >= 1
    assert info["url"] == f"{servers.http}/ok/v1/chat/completions"
    assert info["content_type"].startswith("text/event-stream")


def test_preflight_unreachable():
    url = f"http://127.0.0.1:{free_port()}/"
    with pytest.raises(TargetError) as e:
        preflight(url, get_adapter("openai-chat"), timeout_s=3)
    assert str(e.value) == f"cannot reach target {url}: connection refused; is the server running?"


def test_preflight_wrong_path_names_url_status_and_fix(servers):
    with pytest.raises(TargetError) as e:
        preflight(f"{servers.http}/nothing-here", get_adapter("llama-server"), timeout_s=3)
    msg = str(e.value)
    assert msg.startswith(f"target {servers.http}/nothing-here/completion answered 404 Not Found")
    assert "wrong URL, or wrong adapter ('llama-server'" in msg
    assert "\n" not in msg


def test_preflight_v1_suffix_hint(servers):
    with pytest.raises(TargetError) as e:
        preflight(f"{servers.http}/v1", get_adapter("openai-chat"), timeout_s=3)
    assert "drop '/v1' from the target URL" in str(e.value)


def test_preflight_non_sse_body(servers):
    with pytest.raises(TargetError) as e:
        preflight(f"{servers.http}/json", get_adapter("openai-chat"), timeout_s=3)
    msg = str(e.value)
    assert msg.startswith(
        f"target {servers.http}/json/v1/chat/completions answered 200 with application/json"
    )
    assert "not a server-sent event stream" in msg and "wrong adapter or URL?" in msg


@pytest.mark.parametrize(
    ("code", "fix"),
    [
        (401, "the server wants an API key: set one for the target"),
        (422, "the server rejected the request: check the model name and the adapter options"),
        (503, "the server is not ready (still loading the model?): wait for its health check to pass"),
    ],
)
def test_preflight_http_errors(servers, code, fix):
    with pytest.raises(TargetError) as e:
        preflight(f"{servers.http}/http-{code}", get_adapter("openai-chat"), timeout_s=3)
    url = f"{servers.http}/http-{code}/v1/chat/completions"
    assert str(e.value).startswith(f"target {url} answered {code} ")
    assert str(e.value).endswith(f'({{"error": {{"message": "no way"}}}}); {fix}')


def test_preflight_stream_the_adapter_cannot_read(servers):
    with pytest.raises(TargetError) as e:
        preflight(f"{servers.http}/malformed", get_adapter("openai-chat"), timeout_s=3)
    msg = str(e.value)
    assert msg.startswith(f"target {servers.http}/malformed/v1/chat/completions streamed a line")
    assert "the 'openai-chat' adapter cannot read (not JSON" in msg and msg.endswith("wrong adapter?")
    # An OpenAI chat stream read as SGLang /generate: valid JSON, but no text where SGLang puts it.
    with pytest.raises(TargetError) as e:
        preflight(f"{servers.http}/ok", get_adapter("sglang"), timeout_s=3)
    assert str(e.value) == (
        f"target {servers.http}/ok/generate ended its stream without a generated token the 'sglang' "
        "adapter recognises; wrong adapter?"
    )


def test_preflight_times_out(servers):
    t0 = time.monotonic()
    with pytest.raises(TargetError) as e:
        preflight(f"{servers.http}/stall", get_adapter("openai-chat"), timeout_s=0.5)
    assert time.monotonic() - t0 < 3
    assert "streamed no generated token within 0.5 s" in str(e.value)


# ---- identity ----------------------------------------------------------------------------------


def test_identity_vllm(servers):
    ident = read_identity(f"{servers.http}/vllm", "openai-chat", timeout_s=3)
    assert ident["engine"] == "vllm" and ident["build"] == "0.8.5"
    assert ident["model"] == "meta-llama/Llama-3.1-8B-Instruct" and ident["max_model_len"] == 8192
    assert ident["endpoints"]["/props"] == 404 and ident["endpoints"]["/v1/models"] == 200
    check_expected(ident, {"model": "meta-llama/Llama-3.1-8B-Instruct", "engine": "vllm", "build": "0.8"})


def test_identity_llama_server(servers):
    ident = read_identity(f"{servers.http}/llama", "llama-server", timeout_s=3)
    assert ident["engine"] == "llama.cpp" and ident["build"] == "b4567-1a2b3c4d" and ident["total_slots"] == 4
    assert ident["model_path"] == "/cache/models/qwen2.5-0.5b-instruct-q4_k_m.gguf"
    check_expected(
        ident, {"model": "qwen2.5-0.5b-instruct-q4_k_m.gguf", "engine": "llama-server", "build": "b4567"}
    )


def test_identity_sglang(servers):
    ident = read_identity(f"{servers.http}/sglang", "sglang", timeout_s=3)
    assert ident["engine"] == "sglang" and ident["build"] == "0.4.6.post1"
    assert ident["model_path"] == "meta-llama/Llama-3.1-8B-Instruct"


def test_identity_mismatch_is_one_line(servers):
    url = f"{servers.http}/vllm"
    ident = read_identity(url, "openai-chat", timeout_s=3)
    with pytest.raises(TargetError) as e:
        check_expected(ident, {"model": "Qwen/Qwen2.5-7B-Instruct"})
    assert str(e.value) == (
        f"target {url}: expected model 'Qwen/Qwen2.5-7B-Instruct' but the server serves 'meta-llama/Llama-3.1-8B-Instruct'"
    )
    with pytest.raises(TargetError) as e:
        check_expected(ident, {"engine": "sglang"}, url="http://router:30000")
    assert str(e.value) == "target http://router:30000: expected engine 'sglang' but the server is 'vllm'"


def test_identity_tolerates_missing_and_slow_endpoints(servers):
    t0 = time.monotonic()
    ident = read_identity(f"{servers.http}/slow", None, timeout_s=0.3)
    assert time.monotonic() - t0 < 4
    assert ident["engine"] is None and ident["model"] is None
    assert ident["endpoints"]["/v1/models"] == "no answer within 0.3 s"


def test_identity_unreachable():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(TargetError) as e:
        read_identity(url, "openai-chat", timeout_s=1)
    assert str(e.value) == f"cannot reach target {url}: connection refused; is the server running?"
