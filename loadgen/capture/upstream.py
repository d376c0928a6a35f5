"""The capture proxy's kept-alive HTTP/1.1 connections to its upstream (``UpstreamPool``).

``UpstreamPool.request`` sends one request on a connection (``upstream_connection.py``: the
exchange, and the reply relayed piece by piece to a sink) and returns the reply's head.
Connections are kept alive and reused, most recently used first; one the upstream closed or that
sat idle for ``IDLE_KEEP_S`` is not. A request whose reused connection the upstream closed before
any byte of a reply is sent once more on a new connection when its method is idempotent (sending a
``POST`` twice could generate twice). No connection within the connect timeout is an
``UpstreamError``, as is every failure of the exchange.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Iterable

from yarl import URL

from loadgen.capture.upstream_connection import (
    MAX_HEAD_BYTES,
    ClosedBeforeReply,
    Sink,
    UpstreamConnection,
    UpstreamReply,
)
from loadgen.capture.upstream_head import UpstreamError

__all__ = ["IDEMPOTENT", "IDLE_KEEP_S", "MAX_HEAD_BYTES", "Sink", "UpstreamError", "UpstreamPool", "UpstreamReply"]

# An idle connection older than this is closed, not reused: below the 5 s keep-alive timeout of
# uvicorn (vLLM, SGLang) and llama-server, so those do not close one just as it is reused.
IDLE_KEEP_S = 4.0
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})
_NO_BODY_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "CONNECT"})


class UpstreamPool:
    """Keep-alive HTTP/1.1 connections to one upstream (``http``/``https`` base URL)."""

    def __init__(self, base: URL, *, connect_timeout_s: float, read_timeout_s: float) -> None:
        self._host = base.raw_host or ""
        self._port = base.port or (443 if base.scheme == "https" else 80)
        self._ssl = ssl.create_default_context() if base.scheme == "https" else None
        self._host_header = base.host_port_subcomponent or self._host
        self._path_prefix = base.raw_path.rstrip("/")
        self._connect_timeout_s = connect_timeout_s
        self._read_timeout_s = read_timeout_s
        self._idle: list[UpstreamConnection] = []

    async def request(
        self, method: str, target: str, headers: Iterable[tuple[str, str]], body: bytes
    ) -> UpstreamReply:
        """Send ``method target`` (path and query as received, after the base URL's path) with
        ``headers`` (the caller leaves out hop-by-hop ones) and ``body``; return the reply's head."""
        lines = [f"{method} {self._path_prefix}{target} HTTP/1.1", f"Host: {self._host_header}"]
        lines.extend(f"{k}: {v}" for k, v in headers)
        if body or method not in _NO_BODY_METHODS:
            lines.append(f"Content-Length: {len(body)}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape")
        retried = False
        while True:
            conn = self._take_idle()
            reused = conn is not None
            if conn is None:
                conn = await self._connect()
            try:
                return await conn.exchange(method, head, body)
            except ClosedBeforeReply:
                conn.release()
                if not reused or retried or method not in IDEMPOTENT:
                    raise
                retried = True
            except BaseException:  # the caller was cancelled, or the upstream failed: never reuse it
                conn.release()
                raise

    def close(self) -> None:
        """Close the idle connections (those in use close when their replies are released)."""
        for conn in self._idle:
            conn.close()
        self._idle.clear()

    def _take_idle(self) -> UpstreamConnection | None:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if conn.reusable and now - conn.idle_since < IDLE_KEEP_S:
                return conn
            conn.close()
        return None

    def _put_idle(self, conn: UpstreamConnection) -> None:
        self._idle.append(conn)
        # The oldest sits at the bottom, reached last: close it here once it is too old.
        oldest = self._idle[0]
        if time.monotonic() - oldest.idle_since >= IDLE_KEEP_S:
            self._idle.pop(0)
            oldest.close()

    async def _connect(self) -> UpstreamConnection:
        loop = asyncio.get_running_loop()
        where = f"{self._host}:{self._port}"
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                _, conn = await loop.create_connection(
                    lambda: UpstreamConnection(self._put_idle, self._read_timeout_s),
                    self._host, self._port, ssl=self._ssl,
                    server_hostname=self._host if self._ssl is not None else None,
                )  # fmt: skip
        except TimeoutError:
            raise UpstreamError(f"no connection to {where} within {self._connect_timeout_s:g}s") from None
        except OSError as e:
            raise UpstreamError(f"cannot connect to {where}: {e.strerror or e}") from None
        return conn
