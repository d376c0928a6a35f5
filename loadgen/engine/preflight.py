"""The preflight: one tiny streaming request, sent the way the run will send its requests.

Before any load, ``loadgen run`` calls ``preflight(base_url, adapter)``. The request goes through
the load path's own client (``loadgen.engine.client.SessionConnection``), so the two read a reply alike
and can never disagree on what a target streams; every way it can fail (nothing listening, wrong
path, wrong adapter, no streaming, bad key, a server that trickles its headers or its body) is a
one-line ``TargetError`` that names the URL, what came back and the likely fix. Who is answering
(identity probes, the expected-identity check) is ``targets.identity``'s job.
"""

from __future__ import annotations

import socket
import ssl
import urllib.parse
import uuid
from typing import Any

from loadgen.engine.client import BadBody, SessionConnection
from targets.adapters.base import Adapter, BadChunk, ChatRequest
from targets.errors import TargetError
from targets.identity import certificate_message

__all__ = ["preflight"]


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

    The request goes through the load path's own client (``loadgen.engine.client.SessionConnection``,
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
            return certificate_message(base_url, cause)
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
