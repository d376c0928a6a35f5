"""The OpenAI Responses API: ``POST /v1/responses`` with ``stream: true``.

Request: system messages join into ``instructions``; the rest become ``input`` items: user and
assistant ``message`` items, one ``function_call`` item per assistant tool call (``call_id``,
``name``, ``arguments``) and a ``function_call_output`` item per ``tool`` message. The token budget
is ``max_output_tokens``; ``store: false`` (a load test leaves nothing behind). OpenAI chat ``tools``
definitions (``extra_body={"tools": ...}``) become flat ``{type: function, name, description,
parameters}`` tools. The session id travels in the session header and in ``user``. Bearer auth.

Server-side history (option ``server_history``): a follow-up turn sends only the items after the
previous request's conversation and its reply, plus ``previous_response_id``, the id of that
reply (its ``response.completed`` event, else its ``response.created``; a whole body's ``id``);
the server prepends what it kept. ``store`` is then sent true (a server keeps only stored
responses), and ``instructions`` are sent every time (the API does not carry them over). A turn
whose history does not start with a request this adapter saw answered (the first turn, a history
rewritten, a reply that failed) sends the whole conversation. What a session's requests were
and which responses answered them is kept per session (``MAX_CHAINED_SESSIONS`` sessions, the
last ``MAX_LINKS_PER_SESSION`` requests each); the parser of a request learns which session it
belongs to from the greenlet (or thread) that built the request, since the client creates the
parser in the greenlet that sends it.

Stream (named SSE events; each ``data:`` object repeats its ``type``, which is what is read):

* ``response.output_text.delta`` (reply text), ``response.reasoning_text.delta``,
  ``response.reasoning_summary_text.delta`` (reasoning: generated tokens, not reply text, flagged
  ``StreamEvent.reasoning``),
  ``response.refusal.delta`` and ``response.function_call_arguments.delta`` are token-bearing,
  one token per delta;
* ``response.completed`` and ``response.incomplete`` (``max_output_tokens`` reached) end the
  stream; their ``response.usage`` holds ``input_tokens`` (cached included),
  ``input_tokens_details.cached_tokens``, ``output_tokens`` (reasoning included) and
  ``output_tokens_details.reasoning_tokens``;
* ``response.failed`` (``response.error {code, message}``) and ``error`` (``{code, message}``)
  are errors, with the HTTP status their code stands for (``ERROR_STATUS``);
* every other event (``response.created``, ``response.output_item.added``, ``*.done``, ...)
  carries nothing loadgen counts. There is no ``[DONE]`` (one is accepted as the end).
"""

from __future__ import annotations

import hashlib
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import orjson
from greenlet import getcurrent

from .base import (
    Adapter,
    BadChunk,
    ChatRequest,
    PreparedRequest,
    StreamEvent,
    Usage,
    build_headers,
    content_text,
    count_or_none,
    load_json,
    sse_payload,
    text_or_empty,
)

__all__ = ["ERROR_STATUS", "OpenAIResponsesAdapter", "to_input"]

# Error codes of ``response.failed`` / ``error`` events and the HTTP status they stand for.
ERROR_STATUS: dict[str, int] = {
    "invalid_request_error": 400,
    "invalid_prompt": 400,
    "context_length_exceeded": 400,
    "authentication_error": 401,
    "invalid_api_key": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "rate_limit_exceeded": 429,
    "rate_limit_error": 429,
    "insufficient_quota": 429,
    "server_error": 500,
    "api_error": 500,
    "timeout_error": 504,
    "server_is_overloaded": 503,
    "overloaded_error": 529,
}

_TEXT_DELTA = "response.output_text.delta"
_REASONING_DELTAS = frozenset(("response.reasoning_text.delta", "response.reasoning_summary_text.delta"))
_TOKEN_DELTAS = frozenset(("response.refusal.delta", "response.function_call_arguments.delta"))
_ENDS = frozenset(("response.completed", "response.incomplete"))
# Server-side history: how many sessions' chains are kept, and how many requests of each (a DAG
# session's fan-out children and branch steps each add one while the parent's must stay findable
# for the join: a wide stage would push it out of a short list, and the join resend everything).
MAX_CHAINED_SESSIONS = 4096
MAX_LINKS_PER_SESSION = 64


@dataclass(slots=True)
class _Link:
    """A request of a session: its conversation (length, digest) and the id of its reply."""

    n_messages: int
    digest: bytes
    response_id: str | None = None
    # The call ids of the reply's own function calls: the server holds them, and a follow-up
    # must answer each of them (the API refuses a stored call left without its output).
    server_calls: tuple[str, ...] = ()


class _Chains:
    """Per session, its last requests and the responses that answered them (module docstring)."""

    def __init__(self) -> None:
        self._sessions: OrderedDict[str, list[_Link]] = OrderedDict()
        # The link of the request each greenlet built last, until its parser takes it.
        self._building: weakref.WeakKeyDictionary[Any, _Link] = weakref.WeakKeyDictionary()

    def follow(self, session_id: str, messages: list[dict]) -> tuple[_Link | None, int]:
        """(the held request's link, how many messages the server holds, its reply aside) for a
        new request of ``session_id``, and note the request for its parser; (None, 0) when no
        answered request starts its history, or nothing follows that request's reply."""
        digests = _digests(messages)
        links = self._sessions.get(session_id)
        if links is None:
            links = self._sessions[session_id] = []
            if len(self._sessions) > MAX_CHAINED_SESSIONS:
                self._sessions.popitem(last=False)
        else:
            self._sessions.move_to_end(session_id)
        best: _Link | None = None
        for link in links:
            n = link.n_messages
            if (
                link.response_id is not None
                and n < len(messages)
                and digests[n - 1] == link.digest
                and messages[n].get("role") == "assistant"
                and (best is None or n > best.n_messages)
            ):
                best = link
        link = _Link(len(messages), digests[-1])
        links.append(link)
        del links[:-MAX_LINKS_PER_SESSION]
        self._building[getcurrent()] = link
        if best is None:
            return None, 0
        held = best.n_messages
        while held < len(messages) and messages[held].get("role") == "assistant":
            held += 1  # the reply: the server has its own output
        return (best, best.n_messages) if held < len(messages) else (None, 0)

    def take_building(self) -> _Link | None:
        return self._building.pop(getcurrent(), None)


def _new_part(messages: list[dict], held: int, server_calls: tuple[str, ...] = ()) -> tuple[list[dict], int]:
    """What a request sends when the server holds ``messages[:held]`` and its reply: the
    instructions (the server does not carry them over), the tool calls the client kept in the
    reply's message (its text is the server's own output), then the messages after it; and how
    many leading messages' contents it leaves out (``PreparedRequest.held_messages``).

    Where the reply made function calls of its own (``server_calls``), the server holds those
    calls: the workload's tool results answer them in order (their ``call_id`` becomes the
    server's), a server call with no result left gets an empty one, and only the workload's calls
    beyond the server's are sent as calls of the client's."""
    out = [m for m in messages[:held] if m.get("role") in ("system", "developer")]
    i = held
    kept_calls: list[dict] = []
    while i < len(messages) and messages[i].get("role") == "assistant":
        kept_calls.extend(messages[i].get("tool_calls") or ())
        i += 1
    rest = messages[i:]
    if not server_calls:
        if kept_calls:
            out.append({"role": "assistant", "content": "", "tool_calls": kept_calls})
        return out + rest, i
    # The workload's call ids, in order, each mapped onto a server call while there are some.
    renamed = {c.get("id"): sid for c, sid in zip(kept_calls, server_calls, strict=False)}
    extra = kept_calls[len(server_calls) :]
    if extra:
        out.append({"role": "assistant", "content": "", "tool_calls": extra})
    answered: set[str] = set()
    mapped: list[dict] = []
    for m in rest:
        if m.get("role") == "tool" and m.get("tool_call_id") in renamed:
            sid = renamed[m.get("tool_call_id")]
            answered.add(sid)
            m = {**m, "tool_call_id": sid}
        mapped.append(m)
    missing = [{"role": "tool", "tool_call_id": sid, "content": ""} for sid in server_calls if sid not in answered]
    return out + missing + mapped, i


def _digests(messages: list[dict]) -> list[bytes]:
    """``out[i]`` identifies ``messages[:i + 1]`` (a chained hash of each message's JSON)."""
    out, h = [], b""
    for m in messages:
        h = hashlib.blake2b(
            h + orjson.dumps(m, default=str, option=orjson.OPT_SORT_KEYS), digest_size=16
        ).digest()
        out.append(h)
    return out


class OpenAIResponsesAdapter(Adapter):
    """Options: ``temperature`` (sent when set); ``ignore_eos`` (default False: the OpenAI service
    rejects it; vLLM's and SGLang's Responses endpoints take it); ``store`` (default False);
    ``server_history`` (default False): follow-up turns send only their new items plus
    ``previous_response_id`` (module docstring), and ``store`` is sent true."""

    name = "openai-responses"
    path = "/v1/responses"
    accepts_tools = True

    def __init__(
        self,
        *,
        temperature: float | None = None,
        ignore_eos: bool = False,
        store: bool = False,
        server_history: bool = False,
    ) -> None:
        self.temperature = temperature
        self.ignore_eos = ignore_eos
        self.store = store
        self.server_history = server_history
        self._chains = _Chains() if server_history else None

    def build_request(self, req: ChatRequest) -> PreparedRequest:
        messages = req.messages
        previous_id, held_messages = None, 0
        if self._chains is not None:
            link, held = self._chains.follow(req.session_id, messages)
            if link is not None:
                previous_id = link.response_id
                messages, held_messages = _new_part(messages, held, link.server_calls)
        instructions, items = to_input(messages)
        body: dict[str, Any] = {}
        if req.model is not None:
            body["model"] = req.model
        if instructions:
            body["instructions"] = instructions
        if previous_id is not None:
            body["previous_response_id"] = previous_id
        body["input"] = items
        body["max_output_tokens"] = req.max_tokens
        body["stream"] = req.stream
        body["store"] = self.store or self.server_history
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if self.ignore_eos and req.ignore_eos:
            body["ignore_eos"] = True
        body["user"] = req.session_id
        extra = dict(req.extra_body) if req.extra_body else {}
        tools = extra.pop("tools", None)
        if tools:
            body["tools"] = [_tool(t) for t in tools]
        body.update(extra)
        headers = build_headers(req, stream=req.stream)
        return PreparedRequest("POST", self.path, headers, orjson.dumps(body), req.stream, held_messages)

    def new_stream(self) -> _ResponsesStream:
        return _ResponsesStream(self._chains.take_building() if self._chains is not None else None)

    def parse_response(self, body: bytes) -> StreamEvent:
        obj = load_json(body)
        if self._chains is not None:
            link = self._chains.take_building()
            if link is not None and obj.get("status") in ("completed", "incomplete"):
                link.response_id = _response_id(obj)
                link.server_calls = _function_call_ids(obj)
        if obj.get("status") == "failed" or (obj.get("error") and obj.get("object") != "response"):
            return _error(obj.get("error") if type(obj.get("error")) is dict else obj)
        output = obj.get("output") or []
        if type(output) is not list:
            raise BadChunk("output is not a list in a Responses reply")
        texts, generated = [], False
        for item in output:
            if type(item) is not dict:
                continue
            if item.get("type") == "message":
                for part in item.get("content") or ():
                    if type(part) is dict and part.get("type") == "output_text":
                        texts.append(text_or_empty(part.get("text")))
            elif item.get("type") in ("reasoning", "function_call"):
                generated = True
        text = "".join(texts)
        usage = _usage(obj.get("usage"))
        tokens = (
            usage.completion_tokens
            if usage and usage.completion_tokens is not None
            else int(generated or bool(text))
        )
        return StreamEvent(tokens=tokens, text=text, usage=usage, done=True)


def _tool(t: Any) -> Any:
    """An OpenAI chat function tool as a Responses tool; anything else is passed as given."""
    fn = t.get("function") if type(t) is dict and t.get("type") == "function" else None
    if type(fn) is not dict:
        return t
    out = {"type": "function", "name": fn.get("name")}
    if fn.get("description"):
        out["description"] = fn["description"]
    out["parameters"] = fn.get("parameters") or {"type": "object", "properties": {}}
    return out


def to_input(messages: list[dict]) -> tuple[str, list[dict]]:
    """OpenAI-shaped chat messages as ``(instructions, input items)`` (see the module docstring)."""
    instructions: list[str] = []
    items: list[dict] = []
    for m in messages:
        role = m.get("role")
        content = content_text(m.get("content"))
        if role in ("system", "developer"):
            if content:
                instructions.append(content)
        elif role == "tool":
            items.append(
                {"type": "function_call_output", "call_id": m.get("tool_call_id") or "", "output": content}
            )
        elif role == "assistant":
            calls = m.get("tool_calls") or ()
            if content or not calls:
                items.append({"type": "message", "role": "assistant", "content": content})
            for call in calls:
                fn = call.get("function") or {}
                args = fn.get("arguments")
                items.append(
                    {
                        "type": "function_call",
                        "call_id": call.get("id") or "",
                        "name": fn.get("name") or "",
                        "arguments": args if type(args) is str else orjson.dumps(args or {}).decode(),
                    }
                )
        else:
            items.append({"type": "message", "role": "user", "content": content})
    return "\n\n".join(instructions), items


def _code(code: Any) -> int | None:
    if type(code) is int:
        return code
    if type(code) is str:
        if code.isdigit():
            return int(code)
        return ERROR_STATUS.get(code)
    return None


def _error(err: Any) -> StreamEvent:
    """An error object: ``{code, message}`` (``type`` too in some servers' ``error`` events)."""
    if type(err) is not dict:
        return StreamEvent(error=str(err)[:300])
    code = err.get("code")
    kind = err.get("type")
    status = _code(code)
    if status is None and kind != "error":
        status = _code(kind)
    label = code if type(code) is str else kind if type(kind) is str and kind != "error" else None
    message = str(err.get("message") or label or "error")
    if label and label not in message:
        message = f"{label}: {message}"
    return StreamEvent(error=" ".join(message.split())[:300], error_code=status)


def _usage(u: Any) -> Usage | None:
    if type(u) is not dict:
        return None
    details = u.get("input_tokens_details")
    out = u.get("output_tokens_details")
    return Usage(
        count_or_none(u.get("input_tokens")),
        count_or_none(u.get("output_tokens")),
        count_or_none(details.get("cached_tokens")) if type(details) is dict else None,
        count_or_none(out.get("reasoning_tokens")) if type(out) is dict else None,
    )


def _response_id(resp: Any) -> str | None:
    rid = resp.get("id") if type(resp) is dict else None
    return rid if type(rid) is str and rid else None


def _function_call_ids(resp: Any) -> tuple[str, ...]:
    """The ``call_id`` of each ``function_call`` item in a response's ``output``."""
    output = resp.get("output") if type(resp) is dict else None
    if type(output) is not list:
        return ()
    return tuple(
        item["call_id"]
        for item in output
        if type(item) is dict and item.get("type") == "function_call" and type(item.get("call_id")) is str
    )


class _ResponsesStream:
    """Responses events carry their own state (``response`` objects); the parser keeps only the
    request's link (server-side history), where the reply's id goes."""

    __slots__ = ("_created_id", "_link")
    # loadgen/engine/_chat.c (read_responses) applies this parse_line, in C, to the delta events and
    # those that carry nothing, and hands it the rest; a subclass that changes it must not inherit this.
    COMPILED_PATH = "openai-responses"

    def __init__(self, link: _Link | None = None) -> None:
        self._link = link
        self._created_id: str | None = None

    def parse_line(self, line: bytes) -> StreamEvent | None:
        payload = line[5:].strip() if line.startswith(b"data:") else sse_payload(line)
        if not payload:
            return None
        if payload == b"[DONE]":
            return StreamEvent(done=True)
        obj = load_json(payload)
        kind = obj.get("type")
        if type(kind) is not str:
            if obj.get("error"):  # an error object a proxy or server sent in the OpenAI chat shape
                inner = obj["error"]
                return _error(inner if type(inner) is dict else {"message": str(inner)})
            raise BadChunk("a Responses event without a string type")
        if kind == _TEXT_DELTA:
            text = text_or_empty(obj.get("delta"))
            return StreamEvent(tokens=1, text=text) if text else None
        if kind in _REASONING_DELTAS:
            return StreamEvent(tokens=1, reasoning=True) if text_or_empty(obj.get("delta")) else None
        if kind in _TOKEN_DELTAS:
            return StreamEvent(tokens=1) if text_or_empty(obj.get("delta")) else None
        if kind in _ENDS:
            resp = obj.get("response")
            usage = _usage(resp.get("usage")) if type(resp) is dict else None
            if self._link is not None:  # a whole reply: the next request may name it
                self._link.response_id = _response_id(resp) or self._created_id
                self._link.server_calls = _function_call_ids(resp)
            return StreamEvent(usage=usage, done=True)
        if kind == "response.created" and self._link is not None:
            self._created_id = _response_id(obj.get("response"))
            return None
        if kind == "response.failed":
            resp = obj.get("response")
            err = resp.get("error") if type(resp) is dict else None
            return _error(err if err is not None else {"message": "response failed"})
        if kind == "error":
            inner = obj.get("error")
            return _error(inner if type(inner) is dict else obj)
        return None
