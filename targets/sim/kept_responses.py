"""Responses the sim produced, kept so that a later ``/v1/responses`` request can continue one.

A request with ``previous_response_id`` continues that response: the model sees its own
``instructions``, then the earlier request's conversation (less the earlier instructions: the API
does not carry them over), the earlier reply as an assistant message, then its own ``input``.
Its prompt tokens are therefore what resending the whole history would have cost, and the truth
log's ``prompt_tokens`` says so. An id that is not kept (never produced, evicted, expired) is a
400, as the OpenAI service answers it.

Kept: the last ``max_count`` responses, each for ``keep_s`` seconds, from the moment its
generation is admitted (a client can name it once it has the id, which comes with the first
event). A request that continues a response whose reply made a function call must answer that
call (a ``function_call_output`` with its ``call_id``), else it is a 400, as the service answers
it. Pure bookkeeping: the clock is passed in.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from targets.sim.api import BadRequest

MAX_KEPT = 4096
KEEP_S = 3600.0


class KeptResponses:
    def __init__(self, *, max_count: int = MAX_KEPT, keep_s: float = KEEP_S) -> None:
        self.max_count = max_count
        self.keep_s = keep_s
        # response id -> (when kept, monotonic s; the conversation through its reply)
        self._kept: OrderedDict[str, tuple[float, list[dict[str, Any]]]] = OrderedDict()

    def history_of(self, body: Any, now_s: float) -> list[dict[str, Any]] | None:
        """The conversation a request continues (chat-shaped messages), None when it names none."""
        if not isinstance(body, dict) or body.get("previous_response_id") is None:
            return None
        rid = body["previous_response_id"]
        if not isinstance(rid, str) or not rid:
            raise BadRequest(f"previous_response_id must be a non-empty string (got {rid!r})")
        self._expire(now_s)
        kept = self._kept.get(rid)
        if kept is None:
            raise BadRequest(f"Previous response with id '{rid}' not found.")
        _check_calls_answered(kept[1][-1], body.get("input"))
        return list(kept[1])  # chat_view copies what it extends

    def keep(
        self,
        response_id: str,
        conversation: list[dict[str, Any]],
        reply_text: str,
        now_s: float,
        tool_call: dict[str, Any] | None = None,
    ) -> None:
        """Keep ``response_id``: ``conversation`` is the request's chat view with its instructions
        left out, ``reply_text`` the answer the client gets (reasoning is not part of it), and
        ``tool_call`` the chat-shaped call the reply made, if it made one."""
        reply: dict[str, Any] = {"role": "assistant", "content": reply_text}
        if tool_call is not None:
            reply["tool_calls"] = [tool_call]
        self._kept[response_id] = (now_s, [*conversation, reply])
        self._kept.move_to_end(response_id)
        while len(self._kept) > self.max_count:
            self._kept.popitem(last=False)
        self._expire(now_s)

    def __len__(self) -> int:
        return len(self._kept)

    def _expire(self, now_s: float) -> None:
        kept = self._kept
        while kept:
            t, _ = next(iter(kept.values()))
            if now_s - t < self.keep_s:
                break
            kept.popitem(last=False)


def _check_calls_answered(reply: dict[str, Any], items: Any) -> None:
    """A continued response's function calls must each get a ``function_call_output`` in the
    new input, as the OpenAI service requires (it answers 400 otherwise)."""
    answered = {
        i.get("call_id") for i in (items if isinstance(items, list) else ()) if isinstance(i, dict) and i.get("type") == "function_call_output"
    }
    for call in reply.get("tool_calls") or ():
        if call.get("id") not in answered:
            raise BadRequest(f"No tool output found for function call {call.get('id')}.")


def without_instructions(body: dict, view_messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A Responses request's chat view less the system message its ``instructions`` made."""
    if isinstance(body.get("instructions"), str) and body["instructions"] and view_messages:
        return view_messages[1:]
    return view_messages
