"""Who is answering on that port: identity probes, expected-identity checks, and a preflight.

A server left running from an earlier run answers health checks and gets benchmarked silently
(DESIGN §9). Before any load, ``loadgen run``:

1. ``preflight(base_url, adapter)``: sends one tiny streaming request the way the run will, and
   turns every way it can fail (nothing listening, wrong path, wrong adapter, no streaming, bad
   key) into a one-line ``TargetError`` that names the URL, what came back and the likely fix;
2. ``read_identity(base_url, adapter_name)``: reads what the server says about itself, from
   whichever of these it offers (each probe has its own deadline; absent ones are skipped):

   ===================  ======================================================================
   ``/v1/models``       served model ids and ``owned_by`` (vllm, sglang, llamacpp, loadgen-sim)
   ``/version``         vLLM's version (the sim adds ``engine``)
   ``/props``           llama-server: ``model_path``, ``build_info``, ``total_slots``
   ``/get_server_info`` SGLang: ``version`` and server arguments
   ``/get_model_info``  SGLang: ``model_path``
   ===================  ======================================================================

3. ``check_expected(identity, expect)``: compares with the configured ``model``, ``engine`` and
   ``build`` and stops the run on a mismatch:
   ``target http://...: expected model 'X' but the server serves 'Y'``.

Identity probes use ``http.client``: they cooperate with gevent once Locust has patched
sockets, and work without it. The preflight's request goes through the load path's own client
(``loadgen.client``, gevent sockets, imported when the preflight runs), so the two read a reply
alike and can never disagree on what a target streams.
"""

from __future__ import annotations

import os
import socket
import ssl
import urllib.parse
import uuid
from typing import Any

import orjson

from .adapters.base import Adapter, BadChunk, ChatRequest
from .errors import TargetError
from .scrape import http_get

__all__ = ["EXPECT_KEYS", "check_expected", "normalize_engine", "preflight", "read_identity"]

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
    Raises ``TargetError`` only when nothing is listening or its certificate is refused.
    """
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    base = base_url.rstrip("/")
    docs: dict[str, Any] = {}
    endpoints: dict[str, int | str] = {}
    for path in PROBES:
        try:
            status, _, body = http_get(
                base + path, timeout_s, headers=headers, max_bytes=1 << 20, ssl_context=ssl_context
            )
        except ssl.SSLCertVerificationError as e:
            raise TargetError(_certificate_message(base_url, e)) from None
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


def preflight(
    base_url: str,
    adapter: Adapter,
    *,
    model: str | None = None,
    api_key: str | None = None,
    timeout_s: float = 10.0,
    session_header: str = "X-Session-ID",
    ssl_context: ssl.SSLContext | None = None,
    request_timeout_s: float | None = None,
    first_byte_timeout_s: float | None = None,
    idle_timeout_s: float | None = None,
) -> dict[str, Any]:
    """Send one tiny streaming request as the run will; ``TargetError`` unless it streams tokens.

    The request goes through the load path's own client (``loadgen.client.SessionConnection``,
    with ``adapter``), so the preflight reads the reply exactly as the run will (line ends,
    compression, chunking, multi-line events) and refuses only what the run would fail. One
    deadline bounds all of it, connect to last byte: ``timeout_s``, capped by the run's
    ``request_timeout_s``; the run's ``first_byte_timeout_s`` bounds the headers and its
    ``idle_timeout_s`` a silence in the body, as they will under load. Where the deadline
    passes after a token came, the target is slow but streams: that passes.

    ``ssl_context`` verifies an ``https`` target as the run will (``targets.tls``).

    Returns ``url``, ``status``, ``content_type``, ``ttft_s`` and ``tokens`` (tokens the
    token-bearing chunks carried) for the run record.
    """
    # The load path's client: imported here, so that reading identities needs no gevent.
    from loadgen.client import BadBody, SessionConnection

    u = urllib.parse.urlsplit(base_url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise TargetError(f"target URL {base_url!r} is not http(s)://host[:port]; e.g. http://127.0.0.1:8000")
    req = ChatRequest(
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=4,
        session_id="loadgen-preflight",
        request_id=f"loadgen-preflight-{uuid.uuid4().hex[:12]}",
        model=model,
        session_header=session_header,
    )
    prepared = adapter.build_request(req)
    url = f"{u.scheme}://{u.netloc}{u.path.rstrip('/')}{prepared.path}"
    deadline_s = min(timeout_s, request_timeout_s) if request_timeout_s else timeout_s
    first_byte_s = first_byte_timeout_s if first_byte_timeout_s and first_byte_timeout_s < deadline_s else None
    spy = _Spy(adapter)
    try:
        conn = SessionConnection(
            base_url,
            connect_timeout_s=deadline_s,
            api_key=api_key,
            drain_timeout_s=min(2.0, deadline_s),
            first_byte_timeout_s=first_byte_s,
            idle_timeout_s=idle_timeout_s or None,
            ssl_context=ssl_context,
        )
    except ValueError:
        raise TargetError(f"target URL {base_url!r} is not http(s)://host[:port]; e.g. http://127.0.0.1:8000") from None
    with conn:
        res = conn.stream(prepared, spy, deadline_s=deadline_s)  # type: ignore[arg-type]
        seen = conn.seen()
    headers = seen.headers if seen is not None else {}
    ctype = headers.get("content-type", "")
    tokens = sum(res.chunk_tokens)
    said = _Said(url, base_url, adapter, spy, seen, ctype, deadline_s)
    if res.error_category is not None:
        if tokens and res.error_category == "timeout" and "deadline" in (res.error_message or ""):
            pass  # slow, but it streams: the run's own deadline is the run's business
        else:
            raise TargetError(said.failure(res, isinstance(res.cause, BadBody)))
    elif not res.chunk_tokens:
        raise TargetError(said.empty(res))
    ttft = (res.t_first_ns - res.t_send_ns) / 1e9 if res.t_first_ns is not None else None
    return {"url": url, "status": res.http_status, "content_type": ctype, "ttft_s": ttft, "tokens": tokens}


class _Spy:
    """``adapter`` as the client uses it, keeping the first body lines its parser was given and
    the last line it could not read (to say what came); it parses exactly as ``adapter`` does."""

    def __init__(self, adapter: Adapter) -> None:
        self.adapter = adapter
        self.name = adapter.name
        self.lines: list[bytes] = []  # the first few non-blank lines, as the client split them
        self.bad: tuple[bytes, BadChunk] | None = None

    def auth_headers(self, api_key: str | None) -> dict[str, str]:
        return self.adapter.auth_headers(api_key)

    def parse_response(self, body: bytes):  # pragma: no cover - the preflight always streams
        return self.adapter.parse_response(body)

    def new_stream(self) -> _Spy:
        self._parser = self.adapter.new_stream()
        return self

    def parse_line(self, line: bytes):
        if len(self.lines) < 3:
            self.lines.append(line)
        try:
            return self._parser.parse_line(line)
        except BadChunk as e:
            self.bad = (line, e)
            raise


def _show(data: bytes, n: int = 80) -> str:
    """Bytes as a reader sees them: decoded, line ends escaped, cut at ``n`` characters."""
    text = data[:n].decode("utf-8", "replace").replace("\r", "\\r").replace("\n", "\\n")
    return text + ("..." if len(data) > n else "")


class _Said:
    """The one-line messages of a failed preflight, from what came (``ReplySeen``) and the result."""

    def __init__(self, url, base_url, adapter, spy, seen, ctype, deadline_s) -> None:
        self.url, self.base_url, self.adapter, self.spy = url, base_url, adapter, spy
        self.seen, self.ctype, self.deadline_s = seen, ctype, deadline_s

    def failure(self, res, bad_body: bool) -> str:
        url, base_url, seen, category = self.url, self.base_url, self.seen, res.error_category
        message = res.error_message or ""
        if not res.sent:
            return self.unreachable(res.cause, message)
        if seen is None or not seen.head_complete:
            if category == "timeout":
                return self.no_head(message)
            n = seen.received if seen is not None else 0
            came = f"{n} bytes came: '{_show(seen.first_bytes)}'" if n else "nothing came"
            return (
                f"target {base_url} closed the connection without an HTTP answer ({came}); "
                "is it an HTTP server, and is the scheme (http/https) right?"
            )
        status = seen.status or 0
        if not 200 <= status < 300:
            return _status_message(url, urllib.parse.urlsplit(base_url).path, status, seen, message, self.adapter)
        if category in ("http_4xx", "http_429", "http_5xx"):
            return f"target {url} sent an error in its stream: {message.removeprefix('error in stream: ')}"
        lines = self.spy.lines
        if "text/event-stream" not in self.ctype and category in ("bad_chunk", "stream_cut") and not bad_body:
            first = lines[0] if lines else seen.pending
            return (
                f"target {url} answered {status} with {self.ctype or 'no Content-Type'}, not a server-sent "
                f"event stream ('{_show(first.strip())}'); this path does not stream: wrong adapter or URL?"
            )
        if category == "bad_chunk":
            if bad_body:
                return f"target {url} answered {status} with a body loadgen cannot read: {message}"
            if "loadgen asks for one choice" in message:
                return f"target {url}: {message}; does the server, or a proxy in front of it, set n?"
            return f"target {url} streamed a line the '{self.adapter.name}' adapter cannot read ({message}); wrong adapter?"
        if category == "timeout":
            if res.chunk_tokens:
                return f"target {url} stalled mid-stream: {message}"
            return self.no_token(message)
        if category == "stream_cut" and not res.chunk_tokens and "without its end marker" in message:
            return self.empty(res)
        return f"target {url} broke its stream: {message}"

    def unreachable(self, cause: BaseException | None, message: str) -> str:
        base_url = self.base_url
        if isinstance(cause, ssl.SSLCertVerificationError):
            return _certificate_message(base_url, cause)
        if isinstance(cause, ssl.SSLError):
            return f"target {base_url}: TLS handshake failed ({cause.reason or cause}); is it an https server?"
        if isinstance(cause, ConnectionRefusedError):
            return f"cannot reach target {base_url}: connection refused; is the server running?"
        if isinstance(cause, socket.gaierror):
            host = urllib.parse.urlsplit(base_url).hostname
            return f"cannot reach target {base_url}: unknown host {host!r}"
        if isinstance(cause, TimeoutError) or cause is None:
            if base_url.startswith("https:"):
                return (
                    f"target {base_url} did not complete a TCP and TLS connection within {self.deadline_s:g} s; "
                    "is it up, and is it an https server?"
                )
            return f"target {base_url} did not accept a connection within {self.deadline_s:g} s; is it up and reachable?"
        reason = message.split(": ", 1)[1] if ": " in message else message
        return f"cannot reach target {base_url}: {reason}"

    def no_head(self, message: str) -> str:
        """The deadline (or the first-byte timeout) passed before the headers were complete."""
        seen = self.seen
        first_byte = "first-byte timeout" in message
        after = self._after(message)
        how = f"after {after:g} s (first-byte timeout)" if first_byte else f"after {after:g} s"
        if seen is None or not seen.received:
            return f"target {self.url} sent nothing {how}; is it overloaded or still loading?"
        return (
            f"target {self.url}: headers incomplete {how}: {seen.received} bytes came "
            f"('{_show(seen.first_bytes)}'); is it an HTTP server, and is it stalled?"
        )

    def no_token(self, message: str) -> str:
        seen, url, after = self.seen, self.url, self._after(message)
        head = f"target {url} answered {seen.status} with {self.ctype or 'no Content-Type'}"
        lines = [ln for ln in self.spy.lines if ln.strip()]
        idle = " (idle timeout)" if "idle timeout" in message else ""
        if lines:
            return (
                f"target {url} streamed no generated token within {after:g} s{idle}; is the model loaded? "
                f"(first line: '{_show(lines[0].strip())}')"
            )
        if seen.pending:
            return (
                f"{head} and {len(seen.pending)}{'+' if len(seen.pending) >= 256 else ''} bytes but no complete "
                f"line within {after:g} s{idle} ('{_show(seen.pending)}')"
            )
        return f"{head} but streamed nothing within {after:g} s{idle}"

    def empty(self, res) -> str:
        url, name = self.url, self.adapter.name
        u = res.usage.completion_tokens if res.usage is not None else None
        if u is None:
            if res.ok:
                return (
                    f"target {url} ended its stream without a generated token the '{name}' adapter "
                    "recognises; wrong adapter?"
                )
            return f"target {url} ended its stream without a generated token and without its end marker; wrong adapter?"
        return (
            f"target {url} ended its stream without a generated token (usage.completion_tokens {u}) for a "
            f"request of 4 tokens; {'is the model loaded?' if u == 0 else f'wrong adapter (not {name!r})?'}"
        )

    def _after(self, message: str) -> float:
        """The bound that passed: the first-byte or idle timeout the message names, else the deadline."""
        for marker in (" within ", "no data for "):
            if marker in message and ("first-byte" in message or "idle" in message):
                try:
                    return float(message.split(marker, 1)[1].split(" s", 1)[0])
                except ValueError:
                    break
        return self.deadline_s


def _certificate_message(base_url: str, e: ssl.SSLCertVerificationError) -> str:
    return (
        f"target {base_url}: its TLS certificate is not trusted ({e.verify_message or e.reason}); "
        "give --ca-cert FILE with the certificate or its CA (or --insecure for a throw-away server)"
    )


def _status_message(url: str, base_path: str, status: int, seen: Any, message: str, adapter: Adapter) -> str:
    """A non-2xx answer: what it said (the body's first line) and the likely fix."""
    reason = seen.reason
    first = message.split(": ", 1)[1] if message.startswith("HTTP ") and ": " in message else ""
    if first == reason or message.endswith(", not followed"):
        first = ""
    said = f" ({first[:160]})" if first else ""
    head = f"target {url} answered {status} {reason}".rstrip() + said
    if 300 <= status < 400:
        where = seen.headers.get("location") or "an address it does not name"
        return f"{head}; it redirects to {where}: give that URL as the target (redirects are not followed)"
    if status == 503:
        return f"{head}; the server is not ready (still loading the model?): wait for its health check to pass"
    if status in (404, 405):
        if base_path.rstrip("/").endswith("/v1"):
            return f"{head}; drop '/v1' from the target URL: the adapter adds its own path ({adapter.path})"
        return (
            f"{head}; the server has no {adapter.path}: wrong URL, or wrong adapter "
            f"('{adapter.name}'; others: openai-chat, openai-completions, llama-server, sglang)?"
        )
    if status in (401, 403):
        return f"{head}; the server wants an API key: set one for the target"
    if status in (400, 422):
        return f"{head}; the server rejected the request: check the model name and the adapter options"
    if status == 429:
        return f"{head}; the server is busy before the run starts: is another load running against it?"
    return f"{head}; the server fails on a one-token request: check its logs"
