"""Request bodies of the OpenAI-compatible endpoints: validation and the prompt the model sees.

Pure functions, no I/O. Unknown fields are ignored (clients and routers add their own); a body
that can't be served raises ``BadRequest`` with a one-line message, which the server returns as a
400 with an OpenAI-style error JSON.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from targets.sim.wire import CHAT, COMPLETIONS
from targets.sim.wire_events import MESSAGES, RESPONSES
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
    ignore_eos: bool = False  # vLLM's extension: run to max_tokens whatever the profile's eos_lengths
    tool_names: tuple[str, ...] = ()  # the function tools the request offers, in its order


def parse_request(
    endpoint: str, body: Any, default_max_tokens: int, history: list[dict[str, Any]] | None = None
) -> GenerationRequest:
    """Validate a decoded JSON body of ``/v1/chat/completions`` or ``/v1/completions``.

    Prompt tokens are ``token_ids(render_tools(tools) + render_chat(messages))`` for chat and
    ``token_ids(prompt)`` for completions, with the shared tokenizer (``workloads.tokenizer``).
    Chat accepts OpenAI tool use: ``tools`` (function definitions), assistant messages with
    ``tool_calls`` and ``tool`` messages with ``tool_call_id``. ``history``: the conversation a
    Responses request's ``previous_response_id`` continues (``kept_responses``).
    """
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    tools: list[dict[str, Any]] = []
    if endpoint == CHAT:
        tools = _tools(body.get("tools"))
        text = render_tools(tools) + render_chat(_messages(body.get("messages")))
    elif endpoint == COMPLETIONS:
        text = _prompt(body.get("prompt"))
    elif endpoint in (MESSAGES, RESPONSES):
        return _parse_event_api(endpoint, body, default_max_tokens, history)
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
    return GenerationRequest(endpoint, ids, max_tokens, stream, include_usage, _ignore_eos(body), _names(tools))


def _names(tools: list[dict[str, Any]] | None) -> tuple[str, ...]:
    """The names of chat-shaped function ``tools`` (validated by ``_tools``)."""
    return tuple(t["function"]["name"] for t in tools or ())


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


# --- the event-stream APIs: Anthropic Messages and OpenAI Responses ---------------------------------


def _parse_event_api(
    endpoint: str, body: dict, default_max_tokens: int, history: list[dict[str, Any]] | None = None
) -> GenerationRequest:
    """``/v1/messages`` or ``/v1/responses``: the body seen as a chat request (``chat_view``), so
    the same conversation is the same prompt tokens on every API. Usage is always sent."""
    view = chat_view(endpoint, body, history)
    tools = _tools(view["tools"])
    text = render_tools(tools) + render_chat(_messages(view["messages"]))
    ids = token_ids(text)
    if not ids:
        raise BadRequest("the prompt has no tokens")
    key = "max_tokens" if endpoint == MESSAGES else "max_output_tokens"
    max_tokens = body.get(key)
    if max_tokens is None:
        if endpoint == MESSAGES:
            raise BadRequest("max_tokens: Field required")
        max_tokens = default_max_tokens
    elif isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise BadRequest(f"{key} must be an integer >= 1 (got {max_tokens!r})")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise BadRequest(f"stream must be true or false (got {stream!r})")
    return GenerationRequest(endpoint, ids, max_tokens, stream, True, _ignore_eos(body), _names(tools))


def _ignore_eos(body: dict) -> bool:
    value = body.get("ignore_eos", False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BadRequest(f"ignore_eos must be true or false (got {value!r})")
    return value


def chat_view(endpoint: str, body: Any, history: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A Messages or Responses body as ``{"messages": [...], "tools": [...]}`` in the chat shape.

    Messages: ``system`` leads; ``tool_use`` blocks become assistant ``tool_calls`` and
    ``tool_result`` blocks ``tool`` messages. Responses: ``instructions`` leads; ``input`` (a
    string, or ``message``/``function_call``/``function_call_output`` items) follows, after the
    ``history`` of the response it continues (``previous_response_id``), if any. Other blocks and
    items (images, thinking, reasoning) add nothing.
    """
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    if endpoint == MESSAGES:
        return {"messages": _from_messages(body), "tools": _tools_from(body.get("tools"), nested=True)}
    return {"messages": _from_responses(body, history), "tools": _tools_from(body.get("tools"), nested=False)}


def _block_text(content: Any, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict):
                raise BadRequest(f"{where} content blocks must be objects")
            if part.get("type") in ("text", "input_text", "output_text"):
                if not isinstance(part.get("text"), str):
                    raise BadRequest(f"{where} text block needs a string 'text'")
                texts.append(part["text"])
        return "\n".join(texts)
    raise BadRequest(f"{where} content must be a string or a list of content blocks")


def _from_messages(body: dict) -> list[dict[str, Any]]:
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise BadRequest("messages: must be a non-empty list of {role, content} objects")
    out: list[dict[str, Any]] = []
    system = _block_text(body.get("system"), "system")
    if system:
        out.append({"role": "system", "content": system})
    for i, m in enumerate(raw):
        role = m.get("role") if isinstance(m, dict) else None
        if role not in ("user", "assistant"):
            raise BadRequest(f"messages.{i}.role must be 'user' or 'assistant'")
        content = m.get("content")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise BadRequest(f"messages.{i}.content must be a string or a list of content blocks")
        texts, calls = [], []
        for j, block in enumerate(content):
            if not isinstance(block, dict):
                raise BadRequest(f"messages.{i}.content.{j} must be an object")
            kind = block.get("type")
            if kind == "text":
                texts.append(_block_text([block], f"messages.{i}.content.{j}"))
            elif kind == "tool_use":
                if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                    raise BadRequest(f"messages.{i}.content.{j}: tool_use needs a string id and name")
                args = orjson.dumps(block.get("input") or {}).decode()
                calls.append({"id": block["id"], "type": "function", "function": {"name": block["name"], "arguments": args}})
            elif kind == "tool_result":
                if not isinstance(block.get("tool_use_id"), str):
                    raise BadRequest(f"messages.{i}.content.{j}: tool_result needs a string tool_use_id")
                result = _block_text(block.get("content"), f"messages.{i}.content.{j}")
                out.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": result})
        if texts or calls or not content:
            msg: dict[str, Any] = {"role": role, "content": "\n".join(texts)}
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
    return out


def _from_responses(body: dict, history: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise BadRequest("instructions must be a string")
    if instructions:
        out.append({"role": "system", "content": instructions})
    # Copies: a function_call item joins the assistant message before it, and the history is the
    # kept response's own (it is read once per request parse).
    out.extend({**m, "tool_calls": list(m["tool_calls"])} if "tool_calls" in m else dict(m) for m in history or ())
    raw = body.get("input")
    if isinstance(raw, str):
        raw = [{"role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        raise BadRequest("input must be a string or a non-empty list of items")
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise BadRequest(f"input[{i}] must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise BadRequest(f"input[{i}].role must be user, assistant, system or developer")
            text = _block_text(item.get("content"), f"input[{i}]")
            out.append({"role": "system" if role == "developer" else role, "content": text})
        elif kind == "function_call":
            name, call_id, args = item.get("name"), item.get("call_id"), item.get("arguments", "")
            if not isinstance(name, str) or not isinstance(call_id, str) or not isinstance(args, str):
                raise BadRequest(f"input[{i}]: function_call needs string call_id, name and arguments")
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
            if out and out[-1]["role"] == "assistant":
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id, output = item.get("call_id"), item.get("output")
            if not isinstance(call_id, str):
                raise BadRequest(f"input[{i}]: function_call_output needs a string call_id")
            out.append({"role": "tool", "tool_call_id": call_id, "content": _block_text(output, f"input[{i}]")})
    if not out:
        raise BadRequest("input has no messages")
    return out


def _tools_from(raw: Any, *, nested: bool) -> list[dict[str, Any]] | None:
    """Messages tools ``{name, description, input_schema}`` or Responses function tools ``{type:
    function, name, description, parameters}`` as chat tools; other tool kinds are left out."""
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise BadRequest("tools must be a list")
    out = []
    for j, tool in enumerate(raw):
        if not isinstance(tool, dict):
            raise BadRequest(f"tools[{j}] must be an object")
        if not nested and tool.get("type") != "function":
            continue
        if not isinstance(tool.get("name"), str):
            raise BadRequest(f"tools[{j}] needs a string name")
        fn: dict[str, Any] = {"name": tool["name"]}
        if tool.get("description"):
            fn["description"] = tool["description"]
        params = tool.get("input_schema" if nested else "parameters")
        if params is not None:
            fn["parameters"] = params
        out.append({"type": "function", "function": fn})
    return out
