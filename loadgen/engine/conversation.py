"""What each step of a session sends: the conversation so far plus the step's own message.

Pure: no sockets, no clock. The session driver asks for a step's messages, sends them, and hands
the streamed reply back. A plain step's message and reply become history. A fan-out child sends the
history plus its own message and changes nothing; at the join, the children's outputs become history:
``tool`` messages answering the calls the parent's reply made (children with ``tool_call``), then
one assistant message holding the other children's outputs, in step order. A child that is a chain
(a branch, workloads.dag) keeps a history of its own: each later step of the branch sends the
history, the branch's messages and replies so far, then its own message; at the join the branch's
last output stands for the child.

Tool calls use the OpenAI format: the reply of a step whose children or follow-up answer a tool
call is stored as an assistant message with ``tool_calls`` (id ``call_<step id>``), and the answer
is a ``tool`` message with that ``tool_call_id``. A chain turn with ``role: tool`` and no
``tool_call`` is sent as a user message, as it always was (servers reject a tool message without a
preceding call).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import orjson

from workloads.dag import SessionPlan
from workloads.model import STEP_FAN_OUT_CHILD, STEP_FOLLOW_UP, Session, Turn


def tool_call_id(step_id: str) -> str:
    """The id of the tool call that step ``step_id`` answers."""
    return f"call_{step_id}"


def tool_definitions(session: Session) -> list[dict[str, Any]]:
    """OpenAI ``tools`` for every tool the session calls (sorted by name); empty when none."""
    names = sorted({t.tool_call for t in session.turns if t.tool_call is not None})
    return [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": f"Run {name} and return its output.",
                "parameters": {"type": "object", "properties": {"task": {"type": "string"}}, "required": ["task"]},
            },
        }
        for name in names
    ]


class Conversation:
    """The history of one session as it runs (see the module docstring)."""

    def __init__(self, session: Session, plan: SessionPlan, count: Callable[[str], int] | None = None) -> None:
        self._turns = session.turns
        self._plan = plan
        self._count = count
        # Tokens of the history's message contents, counted once per message as it is added.
        self.history_tokens = 0
        self._tokens_through: list[int] = []  # history tokens of history[:i + 1]
        self.history: list[dict[str, Any]] = []
        # The open fan-out's branches: by the id of a branch's last finished step, its messages
        # and replies since the history, and their history tokens through each (as above).
        self._branches: dict[str, tuple[list[dict[str, Any]], list[int]]] = {}
        if session.system_prompt:
            self._append({"role": "system", "content": session.system_prompt})

    def _append(self, message: dict[str, Any]) -> None:
        self.history.append(message)
        if self._count is not None:
            self.history_tokens += self._count(message.get("content") or "")
            self._tokens_through.append(self.history_tokens)

    def held_tokens(self, held_messages: int, index: int | None = None) -> int | None:
        """Tokens of the first ``held_messages`` messages that step ``index`` sent (the history,
        then its branch's), its system prompt aside (it is sent with every request): what a server
        holding them was not sent. None without a counter; 0 when it holds none."""
        if self._count is None:
            return None
        through = self._tokens_through
        branch = self._branch(index) if index is not None else None
        if branch is not None and held_messages > len(self.history):
            through = through + branch[1]
        n = min(held_messages, len(through))
        if n <= 0:
            return 0
        system = 1 if self.history and self.history[0].get("role") == "system" else 0
        return through[n - 1] - (through[0] if system else 0)

    def prompt_tokens(self, index: int) -> int | None:
        """Tokens of what step ``index`` sends (contents only: roles, template and tool-call JSON
        are the server's to count); None without a counter."""
        if self._count is None:
            return None
        branch = self._branch(index)
        history = branch[1][-1] if branch is not None else self.history_tokens
        return history + self._count(self._turns[index].content)

    def message(self, index: int) -> dict[str, Any]:
        """Step ``index``'s own message."""
        turn: Turn = self._turns[index]
        if turn.tool_call is not None and self._plan.steps[index].kind != STEP_FAN_OUT_CHILD:
            step_id = self._plan.steps[index].step_id
            return {"role": "tool", "tool_call_id": tool_call_id(step_id), "content": turn.content}
        return {"role": "user", "content": turn.content}

    def messages_for(self, index: int) -> list[dict[str, Any]]:
        """What step ``index`` sends: the history, its branch's messages, then its own message (a new list)."""
        branch = self._branch(index)
        if branch is not None:
            return [*self.history, *branch[0], self.message(index)]
        return [*self.history, self.message(index)]

    def _branch(self, index: int) -> tuple[list[dict[str, Any]], list[int]] | None:
        """The branch that step ``index`` extends (its parent's messages and tokens), if any."""
        if not self._branches:
            return None
        step = self._plan.steps[index]
        return self._branches.get(step.parent_ids[0]) if step.kind == STEP_FOLLOW_UP else None

    def extend_branch(self, index: int, reply: str) -> None:
        """After a step of a branch that goes on: its message and reply join the branch's messages."""
        branch = self._branch(index)
        if branch is not None:  # the branch moves on to this step: its lists are this step's now
            del self._branches[self._plan.steps[index].parent_ids[0]]
        messages, through = branch if branch is not None else ([], [])
        for message in (self.message(index), self._assistant(index, reply)):
            messages.append(message)
            if self._count is not None:
                through.append((through[-1] if through else self.history_tokens) + self._count(message.get("content") or ""))
        self._branches[self._plan.steps[index].step_id] = (messages, through)

    def extend(self, index: int, reply: str) -> None:
        """After a plain step: its message and its reply (with the tool calls it makes) become history."""
        self._append(self.message(index))
        self._append(self._assistant(index, reply))

    def join(self, indices: Sequence[int], replies: Sequence[str]) -> None:
        """After a fan-out: the children's outputs become history (tool results, then the rest).
        ``indices`` are the children's steps; ``replies``, each one's branch's last reply."""
        self._branches.clear()
        plain = []
        for index, reply in zip(indices, replies, strict=True):
            step_id = self._plan.steps[index].step_id
            if self._turns[index].tool_call is not None:
                self._append({"role": "tool", "tool_call_id": tool_call_id(step_id), "content": reply})
            else:
                plain.append(reply)
        if plain:
            self._append({"role": "assistant", "content": "\n".join(plain)})

    def _assistant(self, index: int, reply: str) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": reply}
        answered = self._plan.calls_by_parent.get(self._plan.steps[index].step_id)
        if answered:
            msg["tool_calls"] = [self._call(i) for i in answered]
        return msg

    def _call(self, index: int) -> dict[str, Any]:
        step_id = self._plan.steps[index].step_id
        return {
            "id": tool_call_id(step_id),
            "type": "function",
            "function": {
                "name": self._turns[index].tool_call,
                "arguments": orjson.dumps({"task": step_id}).decode(),
            },
        }
