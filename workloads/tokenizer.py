"""The deterministic approximate tokenizer shared by the simulated engine and the workload generator.

Rule (documented in docs/metrics.md): a token is one of
  * a chat-role marker such as ``<|user|>`` (one token),
  * a run of 1-8 word characters (``\\w``; longer words split every 8 characters),
  * one non-space, non-word character (punctuation).
Whitespace is never a token. Token ids are CRC-32 of the piece's UTF-8 bytes, stable across
processes (Python's ``hash`` is salted per process, so it cannot be used).

Because synthetic prompts are built from vocabulary words of at most 8 letters joined by single
spaces, a prompt built for N tokens is exactly N tokens here, and close to N for real BPE
tokenizers (common English words are mostly one token).

The chat template concatenates role-tagged messages, so a conversation's rendered history is a
token prefix of the next turn's prompt: what a prefix cache needs.
"""

from __future__ import annotations

import random
import re
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

_TOKEN_RE = re.compile(r"<\|[a-z_]+\|>|\w{1,8}|[^\w\s]")

# Short common words: each is one token here and, for most BPE vocabularies, one token too.
VOCABULARY: tuple[str, ...] = tuple(
    """
    the of and to in is for on that with as it by this be are from at or an was which not
    have has had but can will all one more also use used new data file code test run value
    time list type call read write open close return error check build make load save start
    stop node user tool agent model query table index cache block token batch queue slot
    step state input output result string number field class method module object server
    client request reply stream chunk event log line path name key map set get put add
    remove update create delete find sort merge split join parse print format config option
    flag mode level limit size count total sum mean max min rate first last next prev
    left right top bottom inner outer local remote public private static shared global
    simple fast slow small large short long early late true false null empty full ready
    """.split()
)
assert all(len(w) <= 8 and w.isalpha() for w in VOCABULARY)

GENERATION_PROMPT = "<|assistant|>\n"


def pieces(text: str) -> list[str]:
    """The token strings of ``text``, in order."""
    return _TOKEN_RE.findall(text)


def count_tokens(text: str) -> int:
    """Number of tokens in ``text``."""
    # findall's list of strings costs a third of a Match object per token (a worker counts every
    # reply it streams, for the next turn's history).
    return len(_TOKEN_RE.findall(text))


def token_ids(text: str) -> list[int]:
    """Stable 32-bit token ids of ``text`` (CRC-32 of each piece)."""
    return [zlib.crc32(p.encode()) for p in _TOKEN_RE.findall(text)]


def synthetic_text(n_tokens: int, rng: random.Random) -> str:
    """Text of exactly ``n_tokens`` tokens: vocabulary words separated by single spaces."""
    if n_tokens <= 0:
        return ""
    words = rng.choices(VOCABULARY, k=n_tokens)
    return " ".join(words)


def render_chat(messages: Iterable[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
    """The sim's chat template: ``<|role|>\\ncontent\\n`` per message, then ``<|assistant|>\\n``.

    Each role marker is one token and newlines are not tokens, so the rendered conversation of
    turn k (generation prompt included) is a token prefix of turn k+1's prompt once the assistant
    reply is appended as a message. An assistant message's OpenAI ``tool_calls`` follow its
    content, one ``<|tool_call|>\\nname arguments\\n`` each.
    """
    parts = []
    for m in messages:
        parts.append(f"<|{m['role']}|>\n{m.get('content') or ''}\n")
        for call in m.get("tool_calls") or ():
            fn = call.get("function") or {}
            parts.append(f"<|tool_call|>\n{fn.get('name', '')} {fn.get('arguments', '')}\n")
    if add_generation_prompt:
        parts.append(GENERATION_PROMPT)
    return "".join(parts)


def render_tools(tools: Iterable[Mapping[str, Any]]) -> str:
    """The sim's rendering of OpenAI ``tools`` definitions, put before the conversation as engines
    do: ``<|tools|>\\n`` then ``name: description`` per function; empty when there are none."""
    lines = []
    for tool in tools:
        fn = tool.get("function") or {}
        lines.append(f"{fn.get('name', '')}: {fn.get('description') or ''}\n")
    return "<|tools|>\n" + "".join(lines) if lines else ""
