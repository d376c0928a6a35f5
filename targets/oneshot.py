"""One request through an adapter, read to the end: the reply text and when its first token came.

For the few requests made outside a load run (a quality check before load, the first-token
probe of a cold start), where the streaming client's clock and Locust are not needed. Uses
``http.client`` with a deadline on the whole exchange; a server failure is returned as data
(``OneShot.error``), never raised, so a caller decides what a failed request means.
"""

from __future__ import annotations

import http.client
import ssl
import time
import urllib.parse
from dataclasses import dataclass

from .adapters.base import Adapter, BadChunk, ChatRequest, StreamEvent

__all__ = ["OneShot", "send_one"]


@dataclass(slots=True)
class OneShot:
    """What one request got back.

    ``t_sent`` and ``t_first`` are ``time.monotonic()`` values: when the request was written and
    when the first token-bearing chunk arrived (None if none did). ``error`` is a one-line reason
    when the request failed (connection, HTTP status, error in the stream, bad chunk, deadline).
    """

    text: str = ""
    tokens: int = 0
    t_sent: float = 0.0
    t_first: float | None = None
    status: int | None = None
    error: str | None = None


def send_one(
    base_url: str,
    adapter: Adapter,
    req: ChatRequest,
    *,
    api_key: str | None = None,
    timeout_s: float = 30.0,
    ssl_context: ssl.SSLContext | None = None,
) -> OneShot:
    """Send ``req`` to ``base_url`` with ``adapter`` and read the whole reply within ``timeout_s``
    (``ssl_context``: an https target's trust, from ``targets.tls``)."""
    u = urllib.parse.urlsplit(base_url)
    prepared = adapter.build_request(req)
    path = u.path.rstrip("/") + prepared.path
    headers = {**prepared.headers, **adapter.auth_headers(api_key)}
    out = OneShot()
    deadline = time.monotonic() + timeout_s
    host = u.hostname or "127.0.0.1"
    if u.scheme == "https":
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(host, u.port, timeout=timeout_s, context=ssl_context)
    else:
        conn = http.client.HTTPConnection(host, u.port, timeout=timeout_s)
    try:
        out.t_sent = time.monotonic()
        conn.request(prepared.method, path, body=prepared.body, headers=headers)
        resp = conn.getresponse()
        out.status = resp.status
        if resp.status != 200:
            first = resp.read(300).decode("utf-8", "replace").strip().splitlines()
            out.error = f"HTTP {resp.status}" + (f": {first[0][:200]}" if first else "")
            return out
        if not prepared.stream:
            ev = adapter.parse_response(resp.read())
            out.t_first = time.monotonic()
            _take(out, ev)
            return out
        parser = adapter.new_stream()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                out.error = f"no end of stream within {timeout_s:g} s"
                return out
            if conn.sock is not None:
                conn.sock.settimeout(left)
            line = resp.readline(1 << 20)
            if not line:
                return out
            ev = parser.parse_line(line)
            if ev is None:
                continue
            if ev.tokens and out.t_first is None:
                out.t_first = time.monotonic()
            _take(out, ev)
            if ev.error is not None or ev.done:
                return out
    except BadChunk as e:
        out.error = f"bad chunk: {e}"
    except TimeoutError:
        out.error = f"no answer within {timeout_s:g} s"
    except (OSError, http.client.HTTPException) as e:
        out.error = f"{type(e).__name__}: {e}"[:200]
    finally:
        conn.close()
    return out


def _take(out: OneShot, ev: StreamEvent) -> None:
    out.text += ev.text
    out.tokens += ev.tokens
    if ev.error is not None:
        out.error = f"error in the stream: {ev.error}"
