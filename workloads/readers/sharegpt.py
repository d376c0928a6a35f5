"""ShareGPT-style conversations and OpenAI chat JSONL: each conversation is a multi-turn session.

Accepted shapes (a JSON array of conversations in a ``.json`` file, or one per line in ``.jsonl``)::

    {"id": "abc", "system": "...", "conversations": [{"from": "human", "value": "..."}, {"from": "gpt", "value": "..."}]}
    {"id": "abc", "messages": [{"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}],
     "max_tokens": 256}

(``conversation`` is taken like ``messages``.) Roles: ``human``/``user``; ``gpt``/``assistant``/
``chatgpt``/``bard``/``bing``/``model`` and LLaMA-Factory's ``function_call`` (an assistant tool
call); ``system``/``developer``; ``tool``/``function``/``observation``/``ipython`` (tool results).

How a conversation becomes a session:

* the top-level ``system`` (FastChat, LLaMA-Factory) and the ``system``/``developer`` messages before
  the first question are the session's system prompt, in that order, joined by a blank line;
* a message's text is its string, or the text parts of an OpenAI content-part list joined by
  newlines; other parts (images, audio, files) are not sent and are counted
  (``non_text_parts_skipped``);
* every user-side message (user or tool) starts a turn; several in a row are joined into one turn
  (blank line between them; role ``tool`` only when all of them are tool results);
* the assistant reply that follows a turn gives that turn's ``max_tokens`` (its token count, at
  least 1): replaying asks the server for an answer as long as the recorded one, and the history of
  later turns holds what the server actually streamed. Consecutive assistant messages are one reply
  (joined by a blank line). An assistant's ``tool_calls`` (or older ``function_call``) count as the
  JSON a model writes for each, ``{"name": ..., "arguments": {...}}``, one per line after its text;
* a reply with no text and no tool call (``value`` missing, null or blank) gives no output length:
  that question and reply are left out of the session and counted (``empty_replies_left_out``);
* assistant messages before the first user message are left out; a last user turn with no reply
  is left out too (its output length is unknown) and counted, unless the line gives
  ``max_tokens`` (or ``max_completion_tokens``), as a request log does: that is its ``max_tokens``;
* ``think_time`` (a workload option, default 0) is the pause before each follow-up turn.

Options: ``min_turns`` / ``max_turns`` drop conversations with fewer / more turns;
``min_prompt_tokens`` / ``max_prompt_tokens`` drop conversations whose longest prompt (the last
turn's system prompt, user/tool messages and recorded replies) is shorter / longer;
``think_time``; ``tenant``. Dropped conversations are counted, never silently lost.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from workloads.dataset import DatasetWorkload
from workloads.errors import WorkloadError
from workloads.readers.base import (
    WorkloadReader,
    iter_json_lines,
    option_duration,
    option_int,
    short,
    whole_number,
)
from workloads.readers.stream import TraceRow, iter_json_array_blocks, iter_text_blocks, lines_of
from workloads.spec import DEFAULT_TENANT
from workloads.text import BUILTIN, TextTokenizer

USER_ROLES = frozenset({"human", "user"})
# LLaMA-Factory's ``function_call`` is the assistant's tool call (its value is the call's JSON).
ASSISTANT_ROLES = frozenset({"gpt", "assistant", "chatgpt", "bard", "bing", "model", "function_call"})
TOOL_ROLES = frozenset({"tool", "function", "observation", "ipython"})
SYSTEM_ROLES = frozenset({"system", "developer"})
ROLE_KINDS = {
    **{r: "user" for r in USER_ROLES},
    **{r: "assistant" for r in ASSISTANT_ROLES},
    **{r: "tool" for r in TOOL_ROLES},
    **{r: "system" for r in SYSTEM_ROLES},
}
TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text"})
MESSAGE_LISTS = (("conversations", "from", "value"), ("messages", "role", "content"), ("conversation", "role", "content"))


class ShareGPTReader(WorkloadReader):
    name = "sharegpt"
    description = "ShareGPT-style conversations (conversations: [{from, value}]), one session each"
    suffixes = (".json", ".jsonl")
    options = {
        "min_turns": "drop conversations with fewer turns (default 1)",
        "max_turns": "drop conversations with more turns",
        "min_prompt_tokens": "drop conversations whose longest prompt is shorter",
        "max_prompt_tokens": "drop conversations whose longest prompt is longer",
        "think_time": "pause before each follow-up turn (default 0s)",
        "tenant": "tenant name of every session (default 'default')",
    }

    @classmethod
    def sniff(cls, path: Path, first: Any) -> bool:
        return isinstance(first, dict) and any(key in first for key, _, _ in MESSAGE_LISTS)

    def iter_rows(
        self,
        path: Path,
        options: Mapping[str, str],
        *,
        tokenizer: TextTokenizer = BUILTIN,
        stats: dict[str, Any] | None = None,
    ) -> Iterator[TraceRow]:
        """The conversations kept, in file order, each validated as it is read; ``stats`` gathers
        the counts ``read`` reports. A ``.jsonl`` file is read line by line, a JSON array element
        by element (``workloads.readers.stream``)."""
        where = str(path)
        self.check_options(options, where)
        min_turns = option_int(options, "min_turns", 1, where=where, at_least=1)
        max_turns = option_int(options, "max_turns", None, where=where, at_least=1)
        min_prompt = option_int(options, "min_prompt_tokens", 0, where=where)
        max_prompt = option_int(options, "max_prompt_tokens", None, where=where, at_least=1)
        think = option_duration(options, "think_time", 0.0, where=where)
        tenant = options.get("tenant", DEFAULT_TENANT) or DEFAULT_TENANT
        assert min_turns is not None and min_prompt is not None
        blocks = iter_text_blocks(path, "ShareGPT file")
        head: list[str] = []
        for block in blocks:  # the first text tells a JSON array from JSON lines
            head.append(block)
            if block.strip():
                break
        text = itertools.chain(head, blocks)
        if "".join(head).lstrip().startswith("["):
            items: Iterator[tuple[int, Any]] = iter_json_array_blocks(path, text)
        else:
            items = iter_json_lines(path, lines_of(text))
        # ShareGPT dumps repeat ids (a long chat split in parts): kept apart by a count per id.
        seen_ids: dict[str, int] = {}
        dropped = {"no_reply": 0, "min_turns": 0, "max_turns": 0, "min_prompt_tokens": 0, "max_prompt_tokens": 0}
        counts = {"empty_replies_left_out": 0, "non_text_parts_skipped": 0}
        st = stats if stats is not None else {}
        st.update(conversations=0, dropped=dropped, trailing_user_turns_left_out=0, **counts)
        kept = 0
        for lineno, obj in items:
            st["conversations"] += 1
            at = f"{where} line {lineno}"
            rec, trailing = _conversation(obj, at, tokenizer, counts)
            st["trailing_user_turns_left_out"] += trailing
            st.update(counts)
            if rec is None:
                dropped["no_reply"] += 1
                continue
            n_turns = len(rec["turns"])
            longest = _longest_prompt(rec, tokenizer)
            reason = None
            if n_turns < min_turns:
                reason = "min_turns"
            elif max_turns is not None and n_turns > max_turns:
                reason = "max_turns"
            elif longest < min_prompt:
                reason = "min_prompt_tokens"
            elif max_prompt is not None and longest > max_prompt:
                reason = "max_prompt_tokens"
            if reason:
                dropped[reason] += 1
                continue
            base = rec["id"] or f"{path.stem}-{lineno}"
            count = seen_ids.get(base, 0)
            seen_ids[base] = count + 1
            rec["id"] = base if count == 0 else f"{base}#{count}"
            rec["tenant"] = tenant
            for t in rec["turns"][1:]:
                t["think_time"] = think
            kept += 1
            yield TraceRow(lineno, None, rec)
        if st["conversations"] == 0:
            raise WorkloadError(f"{where}: holds no conversations; give a JSON list (or JSON lines) of conversations")
        if not kept:
            left = ", ".join(f"{k} {v}" for k, v in dropped.items() if v)
            raise WorkloadError(
                f"{where}: none of its {st['conversations']} conversations is left after the filters ({left}); "
                "loosen --workload-options"
            )

    def read(self, path: Path, options: Mapping[str, str], *, tokenizer: TextTokenizer = BUILTIN) -> DatasetWorkload:
        stats: dict[str, Any] = {}
        records = [row.record for row in self.iter_rows(path, options, tokenizer=tokenizer, stats=stats)]
        stats["dropped"] = {k: v for k, v in stats["dropped"].items() if v}
        return DatasetWorkload(
            records,
            kind=self.name,
            name=path.stem,
            source=str(path),
            options=dict(options),
            stats=stats,
            tokenizer=tokenizer,
        )


def _messages(obj: Any, at: str, counts: dict[str, int]) -> list[tuple[str, str]]:
    """(kind, text) of each message; kind is one of system, user, assistant, tool."""
    if not isinstance(obj, dict):
        raise WorkloadError(f"{at}: {short(obj)} is not a JSON object; give {{\"conversations\": [...]}}")
    for key, role_key, text_key in MESSAGE_LISTS:
        if key not in obj:
            continue
        raw = obj[key]
        if not isinstance(raw, list):
            raise WorkloadError(f"{at}: {key}: {short(raw)} is not a list; give a list of messages")
        out = []
        for i, m in enumerate(raw):
            here = f"{at}: {key}[{i}]"
            if not isinstance(m, dict):
                raise WorkloadError(f"{here}: {short(m)} is not an object; give {{{role_key}, {text_key}}}")
            role = m.get(role_key)
            if not isinstance(role, str):
                raise WorkloadError(f"{here}.{role_key}: {short(role)} is missing or not text")
            role = role.strip().lower()
            kind = ROLE_KINDS.get(role)
            if kind is None:
                raise WorkloadError(
                    f"{here}.{role_key}: unknown role {short(role)}; use human/user, gpt/assistant, "
                    "system/developer, tool/observation or function_call"
                )
            text = _text(m.get(text_key), f"{here}.{text_key}", counts)
            if kind == "assistant":
                calls = _tool_calls(m, here)
                text = "\n".join(t for t in (text, *calls) if t)
            out.append((kind, text))
        return out
    keys = ", ".join(k for k, _, _ in MESSAGE_LISTS)
    raise WorkloadError(f"{at}: no messages; a conversation needs one of {keys}")


def _text(content: Any, where: str, counts: dict[str, int]) -> str:
    """A message's text: a string, or the text parts of an OpenAI content-part list joined by newlines.

    Other parts (images, audio, files) carry no text a replay could send: they are left out and
    counted (``non_text_parts_skipped``).
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise WorkloadError(f"{where}: {short(content)} is not text; use a string or a list of content parts")
    texts = []
    for j, part in enumerate(content):
        if isinstance(part, str):
            texts.append(part)
            continue
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise WorkloadError(
                f'{where}[{j}]: {short(part)} is not a content part; give {{"type": "text", "text": ...}}'
            )
        if part["type"] in TEXT_PART_TYPES:
            value = part.get("text")
            if not isinstance(value, str):
                raise WorkloadError(f"{where}[{j}].text: {short(value)} is not text; use a string")
            texts.append(value)
        else:
            counts["non_text_parts_skipped"] += 1
    return "\n".join(texts)


def _tool_calls(m: dict[str, Any], here: str) -> list[str]:
    """The tool calls of an assistant message as the JSON a model writes, ``{"name", "arguments"}``."""
    calls = m.get("tool_calls")
    if calls is None and isinstance(m.get("function_call"), dict):  # OpenAI's older single call
        calls = [m["function_call"]]
    if calls is None:
        return []
    if not isinstance(calls, list):
        raise WorkloadError(f"{here}.tool_calls: {short(calls)} is not a list; give a list of tool calls")
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function", call) if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise WorkloadError(
                f'{here}.tool_calls[{j}]: {short(call)} is not a tool call; give {{"function": {{"name", "arguments"}}}}'
            )
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                pass  # arguments a model wrote as broken JSON are counted as written
        out.append(json.dumps({"name": fn["name"], "arguments": args}, ensure_ascii=False))
    return out


def _conversation(
    obj: Any, at: str, tokenizer: TextTokenizer, counts: dict[str, int]
) -> tuple[dict[str, Any] | None, int]:
    """The session record of one conversation (None when no turn has a reply) and its dropped tail."""
    messages = _messages(obj, at, counts)
    cid = obj.get("id")
    if cid is not None and not isinstance(cid, str | int):
        raise WorkloadError(f"{at}: id: {short(cid)} is not allowed; use a string or leave it out")
    top_system = obj.get("system")  # FastChat and LLaMA-Factory keep the system prompt here
    if top_system is not None and not isinstance(top_system, str):
        raise WorkloadError(f"{at}: system: {short(top_system)} is not text; use a string")
    last_max = None
    for key in ("max_completion_tokens", "max_tokens"):
        if obj.get(key) is not None:
            last_max = whole_number(obj[key], where=f"{at}: {key}", at_least=1)
            break
    system = [top_system] if top_system else []
    turns: list[dict[str, Any]] = []
    pending: list[tuple[str, str]] = []  # questions not yet answered
    question: list[tuple[str, str]] = []  # the questions the reply in progress answers
    reply: list[str] | None = None  # that reply's parts (consecutive assistant messages)

    def finish() -> None:
        text = "\n\n".join(p for p in reply if p.strip())
        if text:
            turns.append(_turn(question, max(1, tokenizer.count(text))))
        else:
            counts["empty_replies_left_out"] += 1  # no output length is known: question and reply go

    for kind, content in messages:
        if kind == "system" and not turns and not pending and reply is None:
            system.append(content)  # leading system messages form the system prompt
            continue
        if kind == "assistant":
            if reply is not None:
                reply.append(content)  # a second reply in a row continues the first
            elif pending:
                question, pending, reply = pending, [], [content]
            # else: a reply before any question is left out
            continue
        if reply is not None:
            finish()
            reply = None
        # A later system message is part of the next turn, sent as the user's.
        pending.append(("tool" if kind == "tool" else "user", content))
    if reply is not None:
        finish()
    trailing = 0
    if pending:
        if last_max is not None:  # a request log: the line's max_tokens is the last question's
            turns.append(_turn(pending, last_max))
        else:
            trailing = 1
    if not turns:
        return None, trailing
    record = {"id": None if cid is None else str(cid), "system_prompt": "\n\n".join(p for p in system if p), "turns": turns}
    return record, trailing


def _turn(pending: list[tuple[str, str]], max_tokens: int) -> dict[str, Any]:
    role = "tool" if all(r == "tool" for r, _ in pending) else "user"
    content = "\n\n".join(c for _, c in pending)
    return {"content": content, "role": role, "max_tokens": max_tokens}


def _longest_prompt(rec: dict[str, Any], tokenizer: TextTokenizer) -> int:
    total = tokenizer.count(rec["system_prompt"])
    for t in rec["turns"][:-1]:
        total += tokenizer.count(t["content"]) + t["max_tokens"]
    return total + tokenizer.count(rec["turns"][-1]["content"])
