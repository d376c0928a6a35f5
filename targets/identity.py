"""Who is answering on that port: identity probes and expected-identity checks.

A server left running from an earlier run answers health checks and gets benchmarked silently
(docs/targets.md). Before any load, ``loadgen run`` sends its preflight request
(``loadgen.engine.preflight``), then:

1. ``read_identity(base_url, adapter_name)``: reads what the server says about itself, from
   whichever of these it offers (each probe has its own deadline; absent ones are skipped):

   ===================  ======================================================================
   ``/v1/models``       served model ids and ``owned_by`` (vllm, sglang, llamacpp, loadgen-sim)
   ``/version``         vLLM's version (the sim adds ``engine``)
   ``/props``           llama-server: ``model_path``, ``build_info``, ``total_slots``
   ``/get_server_info`` SGLang: ``version`` and server arguments
   ``/get_model_info``  SGLang: ``model_path``
   ===================  ======================================================================

2. ``check_expected(identity, expect)``: compares with the configured ``model``, ``engine`` and
   ``build`` and stops the run on a mismatch:
   ``target http://...: expected model 'X' but the server serves 'Y'``.

Identity probes use ``http.client``: they cooperate with gevent once Locust has patched
sockets, and work without it.
"""

from __future__ import annotations

import os
import ssl
from typing import Any

import orjson

from .errors import TargetError
from .scrape import http_get

__all__ = ["EXPECT_KEYS", "certificate_message", "check_expected", "normalize_engine", "probe_headers", "read_identity"]

EXPECT_KEYS = ("model", "engine", "build")
PROBES = ("/v1/models", "/version", "/props", "/get_server_info", "/get_model_info")

_ENGINE_ALIASES = {
    "vllm": "vllm",
    "sglang": "sglang",
    "llamacpp": "llama.cpp",
    "llama.cpp": "llama.cpp",
    "llama-server": "llama.cpp",
    "llama_cpp": "llama.cpp",
    "loadgen-sim": "sim",
    "sim": "sim",
}


def normalize_engine(name: str | None) -> str | None:
    """``llamacpp``/``llama-server`` -> ``llama.cpp``, ``loadgen-sim`` -> ``sim``; others lower-cased."""
    if name is None:
        return None
    key = str(name).strip().lower()
    return _ENGINE_ALIASES.get(key, key)


# ---- identity ----------------------------------------------------------------------------------


def read_identity(
    base_url: str,
    adapter_name: str | None = None,
    timeout_s: float = 5.0,
    *,
    api_key: str | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> dict[str, Any]:
    """What the server at ``base_url`` says about itself.

    Returns ``base_url``, ``adapter``, ``engine`` (vllm, sglang, llama.cpp, sim, or the server's
    own ``owned_by``; None when nothing says), ``model`` (the first served id), ``models``,
    ``model_path``, ``build``, ``total_slots``, ``max_model_len`` and ``endpoints`` (HTTP status
    or failure per probe). ``ssl_context`` verifies an ``https`` target (``targets.tls``).
    ``api_key`` goes in the adapter's auth headers (``probe_headers``).
    Raises ``TargetError`` only when nothing is listening or its certificate is refused.
    """
    headers = probe_headers(adapter_name, api_key) or None
    base = base_url.rstrip("/")
    docs: dict[str, Any] = {}
    endpoints: dict[str, int | str] = {}
    for path in PROBES:
        try:
            status, _, body = http_get(
                base + path, timeout_s, headers=headers, max_bytes=1 << 20, ssl_context=ssl_context
            )
        except ssl.SSLCertVerificationError as e:
            raise TargetError(certificate_message(base_url, e)) from None
        except ConnectionRefusedError:
            if path == PROBES[0]:
                raise TargetError(
                    f"cannot reach target {base_url}: connection refused; is the server running?"
                ) from None
            endpoints[path] = "connection refused"
            continue
        except TimeoutError:
            endpoints[path] = f"no answer within {timeout_s:g} s"
            continue
        except OSError as e:
            endpoints[path] = (e.strerror or str(e) or type(e).__name__).lower()
            continue
        endpoints[path] = status
        if status == 200:
            try:
                docs[path] = orjson.loads(body)
            except orjson.JSONDecodeError:
                endpoints[path] = "200, not JSON"
    return _identity_from(base_url, adapter_name, docs, endpoints)


def probe_headers(adapter_name: str | None, api_key: str | None) -> dict[str, str]:
    """The adapter's own auth headers (``x-api-key`` and ``anthropic-version`` for the Messages
    API, ``Authorization: Bearer`` for the OpenAI-shaped ones), so a server that checks keys
    answers the probes as it answers the load; Bearer when the adapter is unknown."""
    if adapter_name:
        from .registry import get_adapter  # the adapters load through entry points: only when asked

        try:
            return get_adapter(adapter_name).auth_headers(api_key)
        except TargetError:
            pass
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _identity_from(
    base_url: str, adapter_name: str | None, docs: dict[str, Any], endpoints: dict[str, int | str]
) -> dict[str, Any]:
    def doc(path: str) -> dict:
        d = docs.get(path)
        return d if isinstance(d, dict) else {}

    models_doc, version, props = doc("/v1/models"), doc("/version"), doc("/props")
    server_info, model_info = doc("/get_server_info"), doc("/get_model_info")
    entries = [m for m in models_doc.get("data") or [] if isinstance(m, dict)]
    models = [str(m["id"]) for m in entries if "id" in m]
    owned_by = next((str(m["owned_by"]) for m in entries if m.get("owned_by")), None)
    max_model_len = next((m["max_model_len"] for m in entries if m.get("max_model_len")), None)

    # What the server names itself beats what its endpoints suggest: the sim, for one, mimics
    # SGLang's /get_server_info and vLLM's /version.
    engine = normalize_engine(version.get("engine") or owned_by)
    build = None
    if engine in (None, "sglang") and "version" in server_info:
        engine, build = "sglang", str(server_info["version"])
    if engine in (None, "llama.cpp") and ("build_info" in props or "total_slots" in props):
        engine, build = "llama.cpp", props.get("build_info")
    if engine in (None, "vllm") and "version" in version and build is None:
        engine, build = "vllm", str(version["version"])
    if build is None:
        build = version.get("version") or server_info.get("version") or props.get("build_info")

    model_path = props.get("model_path") or model_info.get("model_path") or server_info.get("model_path")
    model = models[0] if models else (os.path.basename(model_path) if model_path else None)
    return {
        "base_url": base_url,
        "adapter": adapter_name,
        "engine": engine,
        "model": model,
        "models": models,
        "model_path": model_path,
        "build": None if build is None else str(build),
        "total_slots": props.get("total_slots"),
        "max_model_len": max_model_len or server_info.get("context_length"),
        "endpoints": endpoints,
    }


def check_expected(identity: dict[str, Any], expect: dict[str, Any], *, url: str | None = None) -> None:
    """Raise ``TargetError`` unless the server matches every key of ``expect`` (model, engine, build).

    ``model`` matches a served model id, the model path or its file name; ``engine`` matches up
    to aliases (``llama-server`` = ``llama.cpp``); ``build`` matches when it is part of the
    reported build string (``b4567`` matches ``b4567-1a2b3c4d``).
    """
    where = url or identity.get("base_url") or "?"
    for key in expect:
        if key not in EXPECT_KEYS:
            raise TargetError(f"unknown identity key {key!r} in expect; use {', '.join(EXPECT_KEYS)}")
    want = expect.get("model")
    if want is not None:
        served = [*identity.get("models", [])]
        if not served and identity.get("model"):
            served.append(identity["model"])
        names = set(served)
        path = identity.get("model_path")
        if path:
            names |= {path, os.path.basename(path)}
        names |= {os.path.basename(s) for s in served}
        if str(want) not in names:
            shown = (
                ", ".join(served) or (path or "") or "no model it will name (neither /v1/models nor /props)"
            )
            raise TargetError(f"target {where}: expected model '{want}' but the server serves '{shown}'")
    want = expect.get("engine")
    if want is not None:
        got = identity.get("engine")
        if normalize_engine(want) != normalize_engine(got):
            shown = f"is '{got}'" if got else "does not say which engine it is"
            raise TargetError(f"target {where}: expected engine '{want}' but the server {shown}")
    want = expect.get("build")
    if want is not None:
        got = identity.get("build")
        if not got or str(want) not in str(got):
            shown = f"reports '{got}'" if got else "reports no build"
            raise TargetError(f"target {where}: expected build '{want}' but the server {shown}")


# ---- preflight ---------------------------------------------------------------------------------


def certificate_message(base_url: str, e: ssl.SSLCertVerificationError) -> str:
    return (
        f"target {base_url}: its TLS certificate is not trusted ({e.verify_message or e.reason}); "
        "give --ca-cert FILE with the certificate or its CA (or --insecure for a throw-away server)"
    )
