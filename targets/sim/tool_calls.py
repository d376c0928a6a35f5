"""Which replies are tool calls, and what a tool call's arguments say.

A profile's ``tool_calls`` knob, ``{fraction: 0.5, tool: "run_tests"}``: when a chat, Messages or
Responses request offers tools (``tools`` in its body), its reply (after any reasoning) is a call
of one of them with probability ``fraction``, drawn from a generator seeded by (seed, prompt token
ids) as the reply's words and its end are, so the same conversation is a tool call in every run
whatever the arrival order. The tool called is ``tool`` when the request offers it, else the
first tool it offers. A request without tools, a completions request and a known question's
answer (``--answers``) are never tool calls.

The call's arguments are the reply's own tokens: the JSON object ``{"text": " w1 w2 ... wn"}``
streamed one token a delta (the first delta opens the object, the last closes it), so a tool-call
reply has the same tokens, token times and counts as the text reply it replaces.
"""

from __future__ import annotations

import hashlib
import math
import random
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

# The arguments' JSON around the reply's words: every word is plain ASCII letters after a space,
# so the object is valid JSON whatever the words.
ARGS_OPEN = '{"text":"'
ARGS_CLOSE = '"}'


class ToolCallsError(ValueError):
    """A malformed ``tool_calls`` knob; ``str()`` is a one-line message."""


@dataclass(frozen=True, slots=True)
class ToolCalls:
    """The knob: the share of tool-offering requests answered with a call, and the tool preferred."""

    fraction: float
    tool: str | None = None

    def to_dict(self) -> dict:
        return {"fraction": self.fraction, "tool": self.tool}


def parse_tool_calls(raw: object, source: str) -> ToolCalls | None:
    """``{fraction, tool?}`` as ``ToolCalls`` (None stays None); ``ToolCallsError`` naming ``source``."""
    if raw is None or isinstance(raw, ToolCalls):
        return raw
    where = f"{source}: tool_calls"
    if not isinstance(raw, dict):
        raise ToolCallsError(f'{where} must be an object like {{"fraction": 0.5, "tool": "run_tests"}}')
    unknown = sorted(set(raw) - {"fraction", "tool"})
    if unknown:
        raise ToolCallsError(f"{where}: unknown key(s) {', '.join(unknown)} (known: fraction, tool)")
    fraction = raw.get("fraction")
    if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not (
        math.isfinite(fraction) and 0.0 <= fraction <= 1.0
    ):
        raise ToolCallsError(f"{where}.fraction must be a number in [0, 1] (got {fraction!r})")
    tool = raw.get("tool")
    if tool is not None and (not isinstance(tool, str) or not tool):
        raise ToolCallsError(f"{where}.tool must be a non-empty string (got {tool!r})")
    return ToolCalls(float(fraction), tool)


def tool_called(knob: ToolCalls | None, seed: int, prompt_ids: Sequence[int], offered: Sequence[str]) -> str | None:
    """The name of the tool the reply to ``prompt_ids`` calls, or None when it is a text reply."""
    if knob is None or not offered or knob.fraction <= 0.0:
        return None
    digest = hashlib.blake2b(b"tool" + array("I", prompt_ids).tobytes(), digest_size=8).digest()
    rng = random.Random((int(seed) << 64) | int.from_bytes(digest, "little"))
    if rng.random() >= knob.fraction:
        return None
    return knob.tool if knob.tool in offered else offered[0]


def argument_piece(word: str, first: bool, last: bool) -> str:
    """The arguments text one reply token adds: the word, opened by the first, closed by the last."""
    return (ARGS_OPEN if first else "") + word + (ARGS_CLOSE if last else "")


def arguments(words: Sequence[str]) -> str:
    """The whole arguments JSON of a call whose answer tokens are ``words``."""
    return ARGS_OPEN + "".join(words) + ARGS_CLOSE
