"""Request bodies of the OpenAI-compatible endpoints: validation and the prompt the model sees.

Pure functions, no I/O. Unknown fields are ignored (clients and routers add their own); a body
that can't be served raises ``BadRequest`` with a one-line message, which the server returns as a
400 with an OpenAI-style error JSON.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from targets.sim.wire import CHAT, COMPLETIONS
from workloads.tokenizer import render_chat, render_tools, token_ids


class BadRequest(ValueError):
    """The body can't be served; ``str()`` is the message for the client."""


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """What the engine needs from a request body."""

    endpoint: str  # wire.CHAT | wire.COMPLETIONS
    prompt_ids: list[int]
    max_tokens: int
    stream: bool
    include_usage: bool


def parse_request(endpoint: str, body: Any, default_max_tokens: int) -> GenerationRequest:
    """Validate a decoded JSON body of ``/v1/chat/completions`` or ``/v1/completions``.

    Prompt tokens are ``token_ids(render_tools(tools) + render_chat(messages))`` for chat and
    ``token_ids(prompt)`` for completions, with the shared tokenizer (``workloads.tokenizer``).
    Chat accepts OpenAI tool use: ``tools`` (function definitions), assistant messages with
    ``tool_calls`` and ``tool`` messages with ``tool_call_id``.
    """
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    if endpoint == CHAT:
        text = render_tools(_tools(body.get("tools"))) + render_chat(_messages(body.get("messages")))
    elif endpoint == COMPLETIONS:
        text = _prompt(body.get("prompt"))
    else:  # pragma: no cover - the router only mounts the two
        raise BadRequest(f"unknown endpoint {endpoint!r}")
    ids = token_ids(text)
    if not ids:
        raise BadRequest("the prompt has no tokens")
    n = body.get("n")
    if n is not None and n != 1:
        raise BadRequest("only n=1 is supported")
    max_tokens = body.get("max_completion_tokens")
    key = "max_completion_tokens"
    if max_tokens is None:
        max_tokens = body.get("max_tokens")
        key = "max_tokens"
    if max_tokens is None:
        max_tokens = default_max_tokens
    elif isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise BadRequest(f"{key} must be an integer >= 1 (got {max_tokens!r})")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise BadRequest(f"stream must be true or false (got {stream!r})")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise BadRequest("stream_options must be an object")
        include_usage = options.get("include_usage", False)
        if not isinstance(include_usage, bool):
            raise BadRequest("stream_options.include_usage must be true or false")
    return GenerationRequest(endpoint, ids, max_tokens, stream, include_usage)


def _messages(raw: Any) -> list[dict[str, Any]]:
    if not isinstance(raw, list) or not raw:
        raise BadRequest("messages must be a non-empty list of {role, content} objects")
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRequest(f"messages[{i}] must be an object with a string 'role'")
        msg: dict[str, Any] = {"role": m["role"], "content": _content(m.get("content"), i)}
        calls = m.get("tool_calls")
        if calls is not None:
            msg["tool_calls"] = _tool_calls(calls, i)
        call_id = m.get("tool_call_id")
        if call_id is not None and not isinstance(call_id, str):
            raise BadRequest(f"messages[{i}].tool_call_id must be a string")
        out.append(msg)
    return out


def _tool_calls(raw: Any, i: int) -> list[dict[str, Any]]:
    """An assistant message's ``tool_calls``: ``[{id, type: "function", function: {name, arguments}}]``."""
    if not isinstance(raw, list):
        raise BadRequest(f"messages[{i}].tool_calls must be a list")
    for j, call in enumerate(raw):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise BadRequest(f"messages[{i}].tool_calls[{j}] must be an object with function.name")
        if not isinstance(fn.get("arguments", ""), str):
            raise BadRequest(f"messages[{i}].tool_calls[{j}].function.arguments must be a JSON string")
    return raw


def _tools(raw: Any) -> list[dict[str, Any]]:
    """The ``tools`` definitions: ``[{type: "function", function: {name, description?, parameters?}}]``."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise BadRequest("tools must be a list of {type: function, function: {name}} objects")
    for j, tool in enumerate(raw):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise BadRequest(f"tools[{j}] must be an object with function.name")
    return raw


def _content(content: Any, i: int) -> str:
    """String content, or the text parts of an OpenAI content-part list joined (others ignored)."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict):
                raise BadRequest(f"messages[{i}].content parts must be objects")
            if part.get("type") == "text":
                text = part.get("text")
                if not isinstance(text, str):
                    raise BadRequest(f"messages[{i}].content text part needs a string 'text'")
                texts.append(text)
        return "\n".join(texts)
    raise BadRequest(f"messages[{i}].content must be a string, null or a list of content parts")


def _prompt(raw: Any) -> str:
    if isinstance(raw, str):
        return raw
    if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], str):
        return raw[0]
    raise BadRequest("prompt must be a string (or a list of one string)")
