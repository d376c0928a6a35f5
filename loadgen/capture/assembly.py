"""Turning proxied requests into sessions: which conversation a request continues, what it adds.

Pure logic: times are passed in (monotonic seconds), nothing here touches a socket or a file.

Keying. A request carrying the session header belongs to the open conversation of that key. A
request without it continues the open conversation whose last recorded request's messages are the
longest prefix of its own messages (an agent re-sends the whole history each turn); ties go to the
conversation idle the longest. No match starts a new conversation.

What a turn holds. The messages a request adds after the previous recorded request's messages,
less the first of them when it is the assistant reply (the server produced it; a replay
regenerates it). Several added messages become one turn, texts joined by a blank line (role
``tool`` only when all are tool results). ``max_tokens`` is the output length observed in the
reply. ``think_time`` is the gap from the end of the session's previous response (recorded or
not) to this request's arrival; 0 on a session's first recorded turn.

A request that does not extend its keyed conversation (history rewritten, compacted, or re-sent
unchanged) closes that conversation and starts a new one under the same key, id ``KEY#2`` and so
on. A first request that already holds history from before the capture started (assistant
messages included) becomes one first turn of all its non-system text, so its prompt keeps its
size. A reply that fails or is cut leaves the conversation as it was: the turn is dropped, and the
client's next request is attributed against the last recorded one.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from loadgen.capture.apis import (
    CHAT,
    COMPLETIONS,
    MESSAGE_APIS,
    MESSAGES,
    RESPONSES,
    ApiRequest,
    read_request,
)
from loadgen.capture.conversations import (
    CapturedTurn,
    CaptureStats,
    Conversation,
    PendingTurn,
    added_messages,
    added_text,
    idle_first,
    without_reply,
)
from loadgen.capture.messages import (
    MESSAGE_SEPARATOR,
    Message,
    answered_tool,
    prefix_digests,
    split_system,
    turn_text,
)
from loadgen.capture.subagents import KIND_CHILD, KIND_JOIN, child_turn, differs, join_text

__all__ = ["CHAT", "COMPLETIONS", "MESSAGES", "RESPONSES", "SessionAssembler"]


class SessionAssembler:
    """Keeps the open conversations; ``begin`` a request, then ``complete`` or ``drop`` it."""

    def __init__(self, *, idle_timeout_s: float, keep_keys: bool = True) -> None:
        self.idle_timeout_s = idle_timeout_s
        self.keep_keys = keep_keys  # False: every session gets a generated id (the key may be personal)
        self.stats = CaptureStats()
        # Open conversations, least recently active first, so closing idle ones never scans them all.
        self._open: OrderedDict[int, Conversation] = OrderedDict()
        self._superseded: list[Conversation] = []
        self._changed: dict[int, Conversation] = {}  # recorded a turn since the last take_changed()
        self._completions: dict[int, Conversation] = {}  # headerless completions ones with a history
        self._by_key: dict[tuple[str, str], Conversation] = {}
        self._by_history: dict[bytes, list[Conversation]] = {}
        self._by_response: dict[str, Conversation] = {}  # last recorded response id -> its conversation
        self._seq = 0
        self._generated_ids = 0
        self._used_ids: set[str] = set()

    # --- requests ---------------------------------------------------------------------------------
    def begin(self, endpoint: str, body: Any, key: str | None, now_s: float) -> PendingTurn | None:
        """The pending turn of a request body, or None when the body is not one we can record."""
        self.stats.requests += 1
        pending = None
        if isinstance(body, dict):
            if endpoint in MESSAGE_APIS:
                req = read_request(endpoint, body)
                if req is not None:
                    pending = self._begin_conversation(endpoint, req, key, now_s)
            elif endpoint == COMPLETIONS:
                pending = self._begin_completions(body, key, now_s)
        if pending is None:
            self.stats.not_recorded += 1
            return None
        conv = pending.conversation
        conv.in_flight += 1
        self._touch(conv, now_s)
        return pending

    def _begin_conversation(
        self, endpoint: str, req: ApiRequest, key: str | None, now_s: float
    ) -> PendingTurn:
        if req.previous_response_id is not None:
            return self._begin_chained(req, key, now_s)
        msgs = req.messages
        digests = prefix_digests(msgs)
        conv: Conversation | None = None
        added: list[Message] | None = None
        if key is not None:
            conv = self._by_key.get((endpoint, key))
            if conv is not None and (conv.history_digest is not None or conv.chained):
                added = added_messages(conv, msgs, digests)
                if added is None:
                    system = split_system(msgs)[0]
                    if conv.turns and differs(system, req.tools, conv.system_prompt, conv.tools):
                        return self._begin_subagent(conv, req, digests, now_s)
                    self._supersede(conv)
                    conv = None
        else:
            # Longest recorded history first; a match must leave at least one new message.
            for n in range(len(msgs) - 1, 0, -1):
                candidates = self._by_history.get(digests[n - 1])
                if not candidates:
                    continue
                for cand in sorted(candidates, key=idle_first):
                    added = added_messages(cand, msgs, digests)
                    if added is not None:
                        conv = cand
                        break
                if conv is not None:
                    break
        if conv is None:
            conv = self._new_conversation(endpoint, key, now_s)
        system = conv.system_prompt
        if added is None:  # the conversation's first recorded turn: everything but the system prompt
            system, added = split_system(msgs)
        content, role = turn_text(added)
        pending = PendingTurn(
            conv, content, role, system, now_s, conv.last_end_s,
            history_len=len(msgs), history_digest=digests[-1], tool_call=answered_tool(added, msgs),
            tools=req.tools,
        )  # fmt: skip
        return self._mark_join(pending, added, msgs)

    def _mark_join(self, pending: PendingTurn, added: list[Message], msgs: list[Message]) -> PendingTurn:
        """A parent's next request after sub-agents ran is their join (subagents.py)."""
        conv = pending.conversation
        children = [sub for sub in conv.subagents if sub.turns]
        if children:  # the sub-agents' results come back
            pending.children = children
            pending.content, with_results = join_text(added, True)
            if with_results:
                pending.children_tool = pending.tool_call or answered_tool(
                    [m for m in added if m.role == "tool"], msgs
                )
            pending.role, pending.tool_call = "user", None
        return pending

    def _begin_subagent(
        self, parent: Conversation, req: ApiRequest, digests: list[bytes], now_s: float
    ) -> PendingTurn:
        """A sub-agent request of ``parent`` (subagents.py): it continues the open sub-agent whose
        history it extends, else starts one. Its turn's text is all of its non-system text."""
        msgs = req.messages
        sub = next((s for s in parent.subagents if added_messages(s, msgs, digests) is not None), None)
        if sub is None:
            self._seq += 1
            sub = Conversation(seq=self._seq, endpoint=parent.endpoint, key=None, parent=parent)
            parent.subagents.append(sub)
        system, rest = split_system(msgs)
        content, _ = turn_text(rest)
        return PendingTurn(
            sub,
            content,
            "user",
            system,
            now_s,
            sub.last_end_s,
            history_len=len(msgs),
            history_digest=digests[-1],
        )

    def _begin_chained(self, req: ApiRequest, key: str | None, now_s: float) -> PendingTurn:
        """A Responses request naming the previous response: it sends only what is new (the
        server holds the rest), so it continues the conversation that recorded that response."""
        prev = req.previous_response_id
        conv = self._by_response.get(prev) if prev is not None else None
        if key is not None:
            keyed = self._by_key.get((RESPONSES, key))
            if conv is not None and keyed not in (conv, conv.parent):
                conv = None  # the response belongs to another key's conversation
            if conv is None and keyed is not None:
                self._supersede(keyed)  # a chain this conversation never produced
        # Instructions are resent with every request (the server does not carry them over).
        system, added = split_system(req.messages)
        if conv is not None and conv.parent is not None:  # a sub-agent's chain: all it did so far
            so_far = conv.turns[-1].content
            new, _ = turn_text(without_reply(added))
            content = MESSAGE_SEPARATOR.join(t for t in (so_far, new) if t)
            return PendingTurn(
                conv, content, "user", conv.system_prompt, now_s, conv.last_end_s, chained=True
            )
        if conv is None:  # an earlier response not captured: what it did not resend is unknown
            conv = self._new_conversation(RESPONSES, key, now_s)
        else:
            system = conv.system_prompt
            added = without_reply(added)
        content, role = turn_text(added)
        tool_call = answered_tool(added, req.messages)
        if tool_call is None and conv.reply_calls and added and added[0].role == "tool":
            tool_call = conv.reply_calls.get(added[0].call_id or "") or None
        pending = PendingTurn(
            conv, content, role, system, now_s, conv.last_end_s, tool_call=tool_call, chained=True
        )
        return self._mark_join(pending, added, req.messages)

    def _begin_completions(self, body: dict, key: str | None, now_s: float) -> PendingTurn | None:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if not isinstance(prompt, str) or not prompt:
            return None
        conv: Conversation | None = None
        content: str | None = None
        if key is not None:
            conv = self._by_key.get((COMPLETIONS, key))
            if conv is not None and conv.history_prompt is not None:
                content = added_text(conv, prompt)
                if content is None:
                    self._supersede(conv)
                    conv = None
        else:
            best = -1
            for cand in sorted(self._completions.values(), key=idle_first):
                if len(cand.history_prompt or "") > best:
                    added = added_text(cand, prompt)
                    if added is not None:
                        conv, content, best = cand, added, len(cand.history_prompt)
        if conv is None:
            conv = self._new_conversation(COMPLETIONS, key, now_s)
        if content is None:
            content = prompt
        return PendingTurn(conv, content, "user", "", now_s, conv.last_end_s, prompt=prompt)

    # --- replies ------------------------------------------------------------------------------------
    def complete(
        self,
        pending: PendingTurn,
        *,
        output_tokens: int,
        reply_text: str,
        now_s: float,
        response_id: str | None = None,
        reply_calls: dict[str, str] | None = None,
    ) -> None:
        """The reply finished: record the turn and move the conversation's history on.

        ``response_id`` (a Responses reply's id) is what a later request's ``previous_response_id``
        names; ``reply_calls`` (call id -> tool name) are the tool calls the reply made, for a
        chained request's tool results (``reply.Reply`` carries both)."""
        conv = pending.conversation
        self._settle(conv, now_s)
        if conv.parent is not None:  # a sub-agent: kept aside until its parent's join
            self._complete_subagent(conv, pending, output_tokens)
            self._index_response(conv, response_id, reply_calls)
            return
        think = 0.0
        if conv.turns and pending.prev_end_s is not None:
            think = max(0.0, pending.t_request_s - pending.prev_end_s)
        if not conv.turns:
            conv.system_prompt = pending.system_prompt
            conv.session_id = self._session_id(conv)
            conv.arrival_s = pending.t_request_s
            conv.tools = pending.tools
        kind = None
        if pending.children:
            self._fold_children(conv, pending.children, pending.children_tool, pending.prev_end_s)
            last_child_end = max(s.last_end_s or 0.0 for s in pending.children)
            think, kind = max(0.0, pending.t_request_s - last_child_end), KIND_JOIN
        conv.turns.append(
            CapturedTurn(pending.content, pending.role, max(1, output_tokens), think, pending.tool_call, kind)
        )
        self._changed[conv.seq] = conv
        self.stats.turns += 1
        if conv.endpoint in MESSAGE_APIS:
            self._index(conv, remove=True)
            conv.chained = pending.chained
            conv.history_len = 0 if pending.chained else pending.history_len
            conv.history_digest = None if pending.chained else pending.history_digest
            self._index(conv)
            self._index_response(conv, response_id, reply_calls)
        else:
            conv.history_prompt = pending.prompt
            conv.last_reply = reply_text
            if conv.key is None:
                self._completions[conv.seq] = conv

    def _complete_subagent(self, sub: Conversation, pending: PendingTurn, output_tokens: int) -> None:
        if not sub.turns:
            sub.system_prompt = pending.system_prompt
            sub.arrival_s = pending.t_request_s
        else:
            self.stats.subagent_requests_folded += 1
        sub.turns.append(CapturedTurn(pending.content, "user", max(1, output_tokens), 0.0))
        sub.history_len, sub.history_digest = pending.history_len, pending.history_digest

    def _fold_children(
        self, conv: Conversation, children: list[Conversation], tool: str | None, parent_end_s: float | None
    ) -> None:
        """Sub-agents as fan-out children of ``conv``'s last turn (subagents.py)."""
        for sub in children:
            last = sub.turns[-1]
            assert sub.arrival_s is not None
            child = child_turn(last.content, last.max_tokens, sub.arrival_s, parent_end_s)
            conv.turns.append(
                CapturedTurn(child.content, "user", child.max_tokens, child.think_time_s, tool, KIND_CHILD)
            )
            self.stats.turns += 1
            self._index_response(sub, None, None)
        conv.subagents = [s for s in conv.subagents if s not in children]

    def drop(self, pending: PendingTurn, *, cut: bool, now_s: float) -> None:
        """The reply failed (``cut``: the client went away mid-reply): nothing is recorded."""
        self._settle(pending.conversation, now_s)
        if cut:
            self.stats.cut += 1
        else:
            self.stats.failed += 1

    def _settle(self, conv: Conversation, now_s: float) -> None:
        conv.in_flight -= 1
        conv.last_end_s = now_s
        self._touch(conv, now_s)

    def _touch(self, conv: Conversation, now_s: float) -> None:
        conv.last_activity_s = now_s
        if conv.seq in self._open:
            self._open.move_to_end(conv.seq)
        if conv.parent is not None:  # a running sub-agent keeps its parent open
            self._touch(conv.parent, now_s)

    # --- closing ------------------------------------------------------------------------------------
    def take_closed(self, now_s: float, *, everything: bool = False) -> list[Conversation]:
        """Conversations done with (superseded, or idle past the timeout; all with ``everything``)
        that recorded a turn; they leave the assembler. Costs what it closes, not what is open."""
        if everything:
            done = list(self._open.values())
        else:
            done = [c for c in self._superseded if c.in_flight == 0]
            for conv in self._open.values():  # least recently active first
                if now_s - conv.last_activity_s < self.idle_timeout_s:
                    break
                if conv.in_flight == 0 and not conv.superseded:
                    done.append(conv)
        out = []
        for conv in done:
            self._close(conv)
            if conv.turns:
                out.append(conv)
        return out

    def take_changed(self) -> list[Conversation]:
        """Open conversations that recorded a turn since the last call."""
        out = list(self._changed.values())
        self._changed.clear()
        return out

    def _close(self, conv: Conversation) -> None:
        children = [sub for sub in conv.subagents if sub.turns]
        if children and conv.turns:  # no join came: the session ends with its fan-out
            self._fold_children(conv, children, None, conv.last_end_s)
        for sub in conv.subagents:
            self._index_response(sub, None, None)
        self._open.pop(conv.seq, None)
        self._changed.pop(conv.seq, None)
        self._completions.pop(conv.seq, None)
        if conv.superseded:
            self._superseded.remove(conv)
        self._index(conv, remove=True)
        self._index_response(conv, None, None)
        if conv.key is not None and self._by_key.get((conv.endpoint, conv.key)) is conv:
            del self._by_key[(conv.endpoint, conv.key)]

    # --- helpers ------------------------------------------------------------------------------------
    def _new_conversation(self, endpoint: str, key: str | None, now_s: float) -> Conversation:
        self._seq += 1
        conv = Conversation(seq=self._seq, endpoint=endpoint, key=key, last_activity_s=now_s)
        self._open[conv.seq] = conv
        if key is not None:
            self._by_key[(endpoint, key)] = conv
        return conv

    def _supersede(self, conv: Conversation) -> None:
        conv.superseded = True
        self._superseded.append(conv)
        self._index(conv, remove=True)
        self._index_response(conv, None, None)
        if conv.key is not None and self._by_key.get((conv.endpoint, conv.key)) is conv:
            del self._by_key[(conv.endpoint, conv.key)]

    def _index(self, conv: Conversation, *, remove: bool = False) -> None:
        """Headerless conversations are found by their history's digest (sub-agents by their parent)."""
        if conv.key is not None or conv.history_digest is None or conv.parent is not None:
            return
        bucket = self._by_history.setdefault(conv.history_digest, [])
        if remove:
            if conv in bucket:
                bucket.remove(conv)
            if not bucket:
                del self._by_history[conv.history_digest]
        elif not conv.superseded:
            bucket.append(conv)

    def _index_response(
        self, conv: Conversation, response_id: str | None, calls: dict[str, str] | None
    ) -> None:
        """A conversation is found by its last recorded response's id (None: by none)."""
        old = conv.last_response_id
        if old is not None and self._by_response.get(old) is conv:
            del self._by_response[old]
        conv.last_response_id = response_id
        conv.reply_calls = calls
        if response_id is not None and not conv.superseded:
            self._by_response[response_id] = conv

    def _session_id(self, conv: Conversation) -> str:
        if self.keep_keys and conv.key is not None:
            sid, n = conv.key, 1
            while sid in self._used_ids:
                n += 1
                sid = f"{conv.key}#{n}"
        else:
            while True:
                self._generated_ids += 1
                sid = f"capture-{self._generated_ids:06d}"
                if sid not in self._used_ids:
                    break
        self._used_ids.add(sid)
        return sid
