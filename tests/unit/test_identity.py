"""Identity: what each engine's endpoints say, and the one-line mismatch messages."""

from __future__ import annotations

import pytest

from targets.errors import TargetError
from targets.identity import _identity_from, check_expected, normalize_engine

URL = "http://127.0.0.1:8000"


def ident(docs: dict, endpoints: dict | None = None) -> dict:
    return _identity_from(URL, "openai-chat", docs, endpoints or {})


def test_vllm():
    i = ident(
        {
            "/v1/models": {"data": [{"id": "Qwen/Qwen2.5-7B", "owned_by": "vllm", "max_model_len": 32768}]},
            "/version": {"version": "0.9.1"},
        }
    )
    assert (i["engine"], i["model"], i["build"], i["max_model_len"]) == (
        "vllm",
        "Qwen/Qwen2.5-7B",
        "0.9.1",
        32768,
    )


def test_sglang():
    i = ident(
        {
            "/v1/models": {"data": [{"id": "m", "owned_by": "sglang"}]},
            "/get_server_info": {"version": "0.4.6", "context_length": 4096},
            "/get_model_info": {"model_path": "/models/m"},
        }
    )
    assert (i["engine"], i["build"], i["model_path"], i["max_model_len"]) == (
        "sglang",
        "0.4.6",
        "/models/m",
        4096,
    )


def test_llama_server_without_models_list():
    i = ident({"/props": {"model_path": "/cache/q.gguf", "build_info": "b5000-abc", "total_slots": 2}})
    assert (i["engine"], i["model"], i["build"], i["total_slots"]) == ("llama.cpp", "q.gguf", "b5000-abc", 2)


def test_sim_names_itself_though_it_mimics_other_endpoints():
    i = ident(
        {
            "/v1/models": {"data": [{"id": "sim-llama-8b", "owned_by": "loadgen-sim"}]},
            "/version": {"version": "0.1.0", "engine": "loadgen-sim"},
            "/get_server_info": {"version": "0.1.0", "model_path": "sim-llama-8b"},
        }
    )
    assert (i["engine"], i["build"], i["model"]) == ("sim", "0.1.0", "sim-llama-8b")


def test_nothing_known():
    i = ident({}, {"/v1/models": 404})
    assert (
        i["engine"] is None
        and i["model"] is None
        and i["models"] == []
        and i["endpoints"] == {"/v1/models": 404}
    )


def test_normalize_engine():
    assert [
        normalize_engine(x) for x in ("llamacpp", "llama-server", "LLAMA.CPP", "loadgen-sim", "vLLM", None)
    ] == [
        "llama.cpp",
        "llama.cpp",
        "llama.cpp",
        "sim",
        "vllm",
        None,
    ]


IDENT = {
    "base_url": URL,
    "engine": "llama.cpp",
    "model": "q.gguf",
    "models": ["q.gguf"],
    "model_path": "/cache/q.gguf",
    "build": "b5000-abc",
}


def test_matches():
    check_expected(IDENT, {"model": "q.gguf", "engine": "llama-server", "build": "b5000"})
    check_expected(IDENT, {"model": "/cache/q.gguf"})
    check_expected(IDENT, {})


@pytest.mark.parametrize(
    ("expect", "message"),
    [
        (
            {"model": "other.gguf"},
            f"target {URL}: expected model 'other.gguf' but the server serves 'q.gguf'",
        ),
        ({"engine": "vllm"}, f"target {URL}: expected engine 'vllm' but the server is 'llama.cpp'"),
        ({"build": "b4999"}, f"target {URL}: expected build 'b4999' but the server reports 'b5000-abc'"),
        ({"gpu": "h100"}, "unknown identity key 'gpu' in expect; use model, engine, build"),
    ],
)
def test_mismatches(expect, message):
    with pytest.raises(TargetError) as e:
        check_expected(IDENT, expect)
    assert str(e.value) == message


def test_unknown_identity_never_matches():
    blank = {"base_url": URL, "engine": None, "model": None, "models": [], "model_path": None, "build": None}
    with pytest.raises(TargetError, match="the server does not say which engine it is"):
        check_expected(blank, {"engine": "vllm"})
    with pytest.raises(TargetError, match="reports no build"):
        check_expected(blank, {"build": "1"})
    with pytest.raises(TargetError, match="serves 'no model it will name"):
        check_expected(blank, {"model": "m"}, url="http://x")
