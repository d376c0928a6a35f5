"""The adapter contract: build one request, parse one stream line. No sockets, no Locust.

An adapter turns a ``ChatRequest`` (a conversation, a token budget, a session and request id)
into a ``PreparedRequest`` (method, path, headers, body bytes), and turns each line of the
server's reply into a ``StreamEvent``. The streaming client (``loadgen.engine.client``) owns the
connection, the clock and the deadline; adapters are pure and unit-tested on recorded lines.

Per-stream state
----------------
Some wire formats are not self-contained per line: SGLang's native ``/generate`` sends the
*cumulative* text and token count, and vLLM's ``continuous_usage_stats`` sends a cumulative
``completion_tokens`` from which multi-token chunks are recognised. So parsing happens in a
``StreamParser`` that ``Adapter.new_stream()`` creates once per request; the adapter itself
holds only its options and can be shared by every greenlet. ``Adapter.parse_line`` is a
convenience that parses one line as the first line of a fresh stream.

Token counting (docs/metrics.md): a chunk is *token-bearing* when it carries generated text (content
or reasoning). Role-only deltas, ``content: null``, empty strings, keep-alive comments and the
usage chunk carry ``tokens=0`` and never count as the first token. When the API does not say how
many tokens a chunk holds, a token-bearing chunk counts as one.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import orjson

__all__ = [
    "Adapter",
    "BadChunk",
    "ChatRequest",
    "PreparedRequest",
    "StreamEvent",
    "StreamParser",
    "Usage",
    "build_headers",
    "count_or_none",
    "encode_body",
    "error_event",
    "load_json",
    "sse_payload",
    "text_or_empty",
    "usage_from_openai",
]


class BadChunk(ValueError):
    """A stream line the adapter cannot parse (not JSON, not SSE); the client counts ``bad_chunk``."""


@dataclass(slots=True)
class ChatRequest:
    """One turn as the runtime hands it to an adapter.

    ``messages`` are ``{"role": ..., "content": ...}`` dicts, the whole conversation so far.
    ``session_id`` travels in ``session_header`` (and in the body's ``user`` field for OpenAI
    APIs) so routers can keep a session on one replica; ``request_id`` travels in
    ``X-Request-ID``. ``extra_body`` is merged into the JSON body last (it wins);
    ``extra_headers`` likewise into the headers. ``ignore_eos`` asks the engine to generate
    exactly ``max_tokens`` (adapters send it only where the engine accepts it).
    """

    messages: list[dict]
    max_tokens: int
    session_id: str
    request_id: str
    model: str | None = None
    stream: bool = True
    session_header: str = "X-Session-ID"
    extra_body: dict | None = None
    extra_headers: dict | None = None
    ignore_eos: bool = True


@dataclass(slots=True)
class PreparedRequest:
    """What goes on the wire: ``body`` is orjson-encoded JSON; ``path`` is relative to the base URL."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    stream: bool = True
    # How many of the request's conversation messages (from the first) the server holds and the
    # body leaves out, system messages aside (server-side history: openai-responses server_history)
    held_messages: int = 0


@dataclass(slots=True)
class Usage:
    """Token counts the server reported; any of them may be unknown (None)."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    reasoning_tokens: int | None = None  # of completion_tokens (completion/output_tokens_details)


@dataclass(slots=True)
class StreamEvent:
    """What one stream line (or one non-streaming body) says.

    ``tokens``: generated tokens this chunk carries (0 for role-only, empty, keep-alive and usage
    chunks; 1 per token-bearing chunk when the API does not say). ``text``: the reply text the
    chunk adds (what goes back into the conversation); reasoning text is not in it unless the
    adapter's ``reasoning_in_history`` option asks. ``reasoning``: the chunk's tokens are
    reasoning (thinking), not the answer: TTFOT is the first token-bearing chunk without it. A
    chunk that carries both reasoning and answer is not reasoning. ``usage``: counts when the line carries them (the last one seen wins).
    ``done``: the stream is complete (``[DONE]``, llama-server's ``stop: true``).
    ``server_timings``: engine-reported timings (llama-server ``timings``, SGLang ``meta_info``
    latencies). ``error``/``error_code``: an error object sent inside the stream.
    """

    tokens: int = 0
    text: str = ""
    usage: Usage | None = None
    done: bool = False
    server_timings: dict | None = None
    error: str | None = None
    error_code: int | None = None
    reasoning: bool = False


class StreamParser(Protocol):
    """Parses the lines of one response, in order. Created by ``Adapter.new_stream()``."""

    def parse_line(self, line: bytes) -> StreamEvent | None:
        """The event on ``line`` (with or without its newline); None when it carries nothing."""
        ...


class Adapter(ABC):
    """One API flavour. Subclasses set ``name`` and ``path`` and implement the abstract methods.

    Constructor keyword arguments are the adapter's options (``get_adapter(name, **options)``);
    ``options()`` returns them for ``run.json``.
    """

    name: ClassVar[str] = ""
    path: ClassVar[str] = ""
    models_path: ClassVar[str] = "/v1/models"
    # Whether the API takes OpenAI ``tools`` definitions in the body (``extra_body={"tools": ...}``);
    # other flavours see tool calls only as rendered text.
    accepts_tools: ClassVar[bool] = False

    @abstractmethod
    def build_request(self, req: ChatRequest) -> PreparedRequest:
        """The HTTP request for ``req``."""

    @abstractmethod
    def new_stream(self) -> StreamParser:
        """A parser for one response; holds whatever state the wire format needs."""

    @abstractmethod
    def parse_response(self, body: bytes) -> StreamEvent:
        """The whole reply of a non-streaming request as one event (``done=True``)."""

    def parse_line(self, line: bytes) -> StreamEvent | None:
        """Parse ``line`` as the first line of a fresh stream (see the module docstring)."""
        return self.new_stream().parse_line(line)

    @staticmethod
    def auth_headers(api_key: str | None) -> dict[str, str]:
        """``Authorization: Bearer <key>``, or nothing without a key."""
        return {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def options(self) -> dict[str, Any]:
        """The constructor options this adapter runs with (for the run record)."""
        out = {}
        for p in inspect.signature(type(self).__init__).parameters.values():
            if p.kind is p.KEYWORD_ONLY and hasattr(self, p.name):
                out[p.name] = getattr(self, p.name)
        return out

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options().items())
        return f"{type(self).__name__}({opts})"


# ---- helpers shared by the built-in adapters ---------------------------------------------------

_SSE_FIELDS = (b"event", b"id", b"retry")


def sse_payload(line: bytes) -> bytes | None:
    """The payload of an SSE ``data:`` line; None for lines that carry nothing.

    Blank lines, ``:`` comments (keep-alive pings) and ``event:``/``id:``/``retry:`` fields carry
    nothing. Any other line is not SSE: ``BadChunk``.
    """
    if line.startswith(b"data:"):
        return line[5:].strip()
    s = line.strip()
    if not s or s[:1] == b":":
        return None
    if s.split(b":", 1)[0].strip() in _SSE_FIELDS:
        return None
    raise BadChunk(f"not an SSE line: {_preview(s)}")


def sse_json(line: bytes) -> dict | StreamEvent | None:
    """One SSE line of a JSON stream: its JSON object, a done or error ``StreamEvent``, or None
    when the line carries nothing. The ``data:`` test is inlined: this runs once per chunk."""
    payload = line[5:].strip() if line.startswith(b"data:") else sse_payload(line)
    if not payload:
        return None
    if payload == b"[DONE]":
        return StreamEvent(done=True)
    obj = load_json(payload)
    err = error_event(obj)
    return obj if err is None else err


def load_json(payload: bytes) -> dict:
    """``payload`` as a JSON object, else ``BadChunk``."""
    try:
        obj = orjson.loads(payload)
    except orjson.JSONDecodeError:
        raise BadChunk(f"not JSON: {_preview(payload)}") from None
    if type(obj) is not dict:
        raise BadChunk(f"not a JSON object: {_preview(payload)}")
    return obj


def error_event(obj: dict) -> StreamEvent | None:
    """An error object sent inside a stream, in the shapes servers use, else None.

    ``{"error": {"message", "code", ...}}`` (OpenAI, newer vLLM, SGLang, llama-server),
    ``{"error": "text"}`` and ``{"object": "error", "message", "code"}`` (older vLLM).
    """
    err = obj.get("error")
    if err is None:
        if obj.get("object") != "error":
            return None
        err = obj
    if isinstance(err, dict):
        message = str(err.get("message") or err.get("type") or "error")
        code = err.get("code")
    else:
        message, code = str(err), None
    try:
        code = int(code) if code is not None else None
    except (TypeError, ValueError, OverflowError):
        code = None
    return StreamEvent(error=" ".join(message.split())[:300], error_code=code)


def usage_from_openai(u: Any) -> Usage:
    """``usage`` of an OpenAI-style chunk, with ``prompt_tokens_details.cached_tokens``.

    A count that is not a non-negative integer is unknown (None); a ``usage`` that is not an
    object is ``BadChunk``.
    """
    if type(u) is not dict:
        raise BadChunk(f"usage is not a JSON object: {_preview(repr(u).encode())}")
    details = u.get("prompt_tokens_details")
    out = u.get("completion_tokens_details")
    return Usage(
        prompt_tokens=count_or_none(u.get("prompt_tokens")),
        completion_tokens=count_or_none(u.get("completion_tokens")),
        cached_tokens=count_or_none(details.get("cached_tokens")) if type(details) is dict else None,
        reasoning_tokens=count_or_none(out.get("reasoning_tokens")) if type(out) is dict else None,
    )


def count_or_none(value: Any) -> int | None:
    """``value`` when it is a token count (an integer >= 0, not a bool), else None."""
    return value if type(value) is int and value >= 0 else None


def text_or_empty(value: Any) -> str:
    """Generated text as the server sent it: a string, or "" for null/absent; anything else is
    ``BadChunk`` (a number or object where text belongs is a broken stream, not an empty token)."""
    if type(value) is str:
        return value
    if value is None:
        return ""
    raise BadChunk(f"text is not a string: {_preview(repr(value).encode())}")


def build_headers(req: ChatRequest, *, stream: bool) -> dict[str, str]:
    """The headers every adapter sends: content type, accept, request id, session header."""
    headers = {
        "Content-Type": "application/json",
        "Accept": "text/event-stream" if stream else "application/json",
        "X-Request-ID": req.request_id,
        req.session_header: req.session_id,
    }
    if req.extra_headers:
        headers.update(req.extra_headers)
    return headers


def encode_body(body: dict, req: ChatRequest) -> bytes:
    if req.extra_body:
        body.update(req.extra_body)
    return orjson.dumps(body)


def _preview(b: bytes, n: int = 80) -> str:
    return repr(bytes(b[:n])) + ("..." if len(b) > n else "")


def content_text(content: Any) -> str:
    """OpenAI message content as text: a string, or its text parts joined."""
    if content is None:
        return ""
    if type(content) is str:
        return content
    if type(content) is list:
        return "\n".join(p.get("text", "") for p in content if type(p) is dict and p.get("type") == "text")
    return str(content)
