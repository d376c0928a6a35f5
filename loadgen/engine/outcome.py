"""The outcome of one request as the client saw it: ``StreamResult``, the error categories, and
the checks on a reply that only the request's own ``max_tokens`` can decide.

Categories (``analysis.records.ERROR_CATEGORIES``) are described in ``loadgen.engine.client``;
``connect_error_category`` tells the generator's own network failures (``client_network``) from
the target's (``connection``).
"""

from __future__ import annotations

import errno
import socket
import ssl
from dataclasses import dataclass, field

# The category names are declared once, with their fault class, in the metric registry.
from analysis.metric_registry import (
    BAD_CHUNK as BAD_CHUNK,
)
from analysis.metric_registry import (
    CLIENT_NETWORK as CLIENT_NETWORK,
)
from analysis.metric_registry import (
    CONNECTION as CONNECTION,
)
from analysis.metric_registry import (
    EMPTY_REPLY as EMPTY_REPLY,
)
from analysis.metric_registry import (
    HTTP_3XX as HTTP_3XX,
)
from analysis.metric_registry import (
    HTTP_4XX as HTTP_4XX,
)
from analysis.metric_registry import (
    HTTP_5XX as HTTP_5XX,
)
from analysis.metric_registry import (
    HTTP_429 as HTTP_429,
)
from analysis.metric_registry import (
    STREAM_CUT as STREAM_CUT,
)
from analysis.metric_registry import (
    TIMEOUT as TIMEOUT,
)
from targets.adapters.base import Usage

MESSAGE_CHARS = 200


@dataclass(slots=True)
class StreamResult:
    """The outcome of one request; times are ``time.perf_counter_ns()`` values.

    ``chunk_ns`` and ``chunk_tokens`` are parallel lists over token-bearing chunks. ``text`` is
    the generated text (what the runtime appends to the conversation). ``usage`` and
    ``server_timings`` are the last the server reported. ``reused_connection`` says whether the
    request went over a connection kept from an earlier request. ``throttled`` counts 429
    answers waited out (``Retry-After``) before this result. ``t_send_ns`` stays 0 when nothing
    of the request left (``sent`` is False: the connect failed). ``streamed``: the reply was read
    as a stream (else as one body). ``cause``: the exception behind a failure, where one was (for
    messages such as the preflight's; never recorded). ``t_first_output_ns``: the first
    token-bearing chunk that is not reasoning (None when every one was); ``reasoning_chunk_tokens``:
    the tokens reasoning chunks carried.
    """

    t_send_ns: int = 0
    t_first_ns: int | None = None
    chunk_ns: list[int] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    t_end_ns: int | None = None
    http_status: int | None = None
    usage: Usage | None = None
    server_timings: dict | None = None
    text: str = ""
    error_category: str | None = None
    error_message: str | None = None
    retry_after_s: float | None = None
    reused_connection: bool = False
    throttled: int = 0
    streamed: bool = False
    cause: BaseException | None = None
    t_first_output_ns: int | None = None
    reasoning_chunk_tokens: int = 0

    @property
    def ok(self) -> bool:
        return self.error_category is None

    @property
    def sent(self) -> bool:
        """Whether the request was written (in part at least): False when the connect failed."""
        return self.t_send_ns != 0

    @property
    def t_last_ns(self) -> int | None:
        return self.chunk_ns[-1] if self.chunk_ns else None

    @property
    def output_tokens(self) -> int:
        """N by ``output_tokens()``'s rule, from ``usage`` and the tokens the chunks carried."""
        return output_tokens(self.usage.completion_tokens if self.usage is not None else None, self.chunk_tokens)

    @property
    def reasoning_tokens(self) -> int:
        """Reasoning tokens: ``usage``'s ``reasoning_tokens`` where the server reports it and it is
        at least the tokens the reasoning chunks carried, else those tokens; never above N."""
        counted = self.reasoning_chunk_tokens
        u = self.usage.reasoning_tokens if self.usage is not None else None
        n = u if u is not None and u >= counted else counted
        return min(n, self.output_tokens)


def output_tokens(usage_completion_tokens: int | None, chunk_tokens: list[int]) -> int:
    """N, a reply's output tokens (docs/metrics.md): ``usage.completion_tokens`` where the server
    reports it and it is at least the tokens the token-bearing chunks carried (the server's exact
    count: a chunk may carry several tokens, or tokens without text); else, where usage is absent
    or claims fewer tokens than chunks that carried them (impossible), the chunks' count."""
    counted = sum(chunk_tokens)
    if usage_completion_tokens is not None and usage_completion_tokens >= counted:
        return usage_completion_tokens
    return counted


def empty_reply_message(res: StreamResult, max_tokens: int | None) -> str | None:
    """Why ``res`` is an empty reply, or None: a successful reply with no token-bearing chunk (no
    generated text or token count) to a request that asked for at least one token. Says what
    arrived: a stream's token chunks, a body's text, and the usage the server reported."""
    if res.error_category is not None or res.chunk_tokens or not max_tokens or max_tokens < 1:
        return None
    u = res.usage.completion_tokens if res.usage is not None else None
    said = "no usage reported" if u is None else f"usage.completion_tokens {u}"
    if res.streamed:
        return f"stream ended after 0 token chunks; {said}"
    return f"reply body carried no generated text; {said}"


def check_reply(res: StreamResult, max_tokens: int | None) -> None:
    """Mark a successful ``res`` that is an empty reply (``empty_reply_message``) as failed,
    ``empty_reply``: a server that answers every request with nothing must not pass."""
    message = empty_reply_message(res, max_tokens)
    if message is not None:
        fail(res, EMPTY_REPLY, message)


_NETWORK_ERRNOS = frozenset(
    getattr(errno, name)
    for name in (
        "ENETUNREACH", "EHOSTUNREACH", "ENETDOWN", "EADDRNOTAVAIL", "EADDRINUSE", "EMFILE", "ENFILE",
        "ENOBUFS", "ENOMEM",
    )
    if hasattr(errno, name)
)  # fmt: skip


def connect_error_category(e: BaseException) -> str:
    """The category of a connect that failed: ``client_network`` where the generator's own side
    failed before anything left it (no route or link, no local address or port, no file
    descriptor or buffer, its name lookup), else ``connection`` (refused, timed out, reset: the
    server's side)."""
    if isinstance(e, socket.gaierror):
        return CLIENT_NETWORK
    if isinstance(e, OSError) and not isinstance(e, ssl.SSLError) and e.errno in _NETWORK_ERRNOS:
        return CLIENT_NETWORK
    return CONNECTION


def fail(res: StreamResult, category: str, message: str) -> None:
    """``res`` ended in ``category``; its message is one line of at most ``MESSAGE_CHARS``."""
    res.error_category = category
    one_line = " ".join(message.split())
    res.error_message = one_line if len(one_line) <= MESSAGE_CHARS else one_line[: MESSAGE_CHARS - 3] + "..."
