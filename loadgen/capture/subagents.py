"""Sub-agents in captured traffic: the rule that recognises them, and how they become fan-out.

The rule. Under one session key, a request that does not extend the key's conversation, and whose
system prompt or tool set differs from that conversation's, is a *sub-agent* request of it (an
agent that hands a task to a sub-agent runs it under its own session, with the sub-agent's own
instructions and tools, while its own turn waits for the result). The same system prompt and tools
with a rewritten history is a compacted or rewritten conversation instead (``KEY#2``), as before. A
sub-agent request that extends one of the conversation's open sub-agents (history prefix)
continues it; else it starts another. Headerless traffic is never read as fan-out: without a key,
nothing ties a new conversation to one parent among the open ones.

What is recorded. At the parent's next recorded request, the *join*, the sub-agents begun since
its last turn become **fan-out children** of that turn (docs/workloads.md, "Agent sessions as
DAGs"), one child per sub-agent, in the order they started:

* ``content``: the non-system text of the sub-agent's last request (its task and all it did), so
  the child's own message keeps the sub-agent's context size; ``max_tokens``: its last reply's
  length (the answer the parent gets back); ``think_time``: from the parent's reply to the
  sub-agent's first request. The sub-agent's earlier requests are folded into that one
  (``CaptureStats.subagent_requests_folded``), as a fan-out child is one request.
* ``tool_call``: when the join's new messages are tool results, the tool they answer: the
  children's outputs go back as that tool's results; the join's own message is then what it adds
  besides them (a one-token message, ``.``, when nothing), and its ``think_time`` counts from the
  last child's reply.

A parent that closes with sub-agents but no join ends with its fan-out (a session may).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from analysis.metric_registry import STEP_KIND_FAN_OUT_CHILD, STEP_KIND_JOIN
from loadgen.capture.messages import MESSAGE_SEPARATOR, Message

KIND_CHILD = STEP_KIND_FAN_OUT_CHILD
KIND_JOIN = STEP_KIND_JOIN
EMPTY_JOIN_TEXT = "."  # one token under loadgen's tokenizer: a join must send a message


@dataclass(frozen=True, slots=True)
class ChildTurn:
    """A sub-agent as one fan-out child (``assembly.CapturedTurn`` fields)."""

    content: str
    max_tokens: int
    think_time_s: float


def differs(
    system_prompt: str, tools: tuple[str, ...], parent_system: str, parent_tools: tuple[str, ...]
) -> bool:
    """Whether a request's system prompt or tool set is not its would-be parent's."""
    return system_prompt != parent_system or set(tools) != set(parent_tools)


def child_turn(
    last_content: str, last_max_tokens: int, first_request_s: float, parent_end_s: float | None
) -> ChildTurn:
    """A sub-agent's child turn from its last recorded request and when it began."""
    think = 0.0 if parent_end_s is None else max(0.0, first_request_s - parent_end_s)
    return ChildTurn(last_content, last_max_tokens, think)


def join_text(added: Sequence[Message], with_children: bool) -> tuple[str, bool]:
    """(the join's own text, whether its tool results are the children's outputs). With tool
    results among ``added``, they are the children's outputs and the rest is the join's text."""
    results = [m for m in added if m.role == "tool"]
    if not with_children or not results:
        return MESSAGE_SEPARATOR.join(m.text for m in added if m.text), False
    rest = MESSAGE_SEPARATOR.join(m.text for m in added if m.role != "tool" and m.text)
    return rest or EMPTY_JOIN_TEXT, True
