"""One agent session on the wire: steps in order, each re-sending the growing conversation.

Turn k sends the system prompt, every previous user/tool message, the assistant replies the
server *actually* streamed, and the new message. Between turns the agent thinks for the turn's
``think_time_s``: the next turn's intended time is the previous turn's end plus that time, and
its schedule lag is measured against it. A failed turn ends the session (the conversation cannot
go on without the reply); the failure is a record, never an exception.

A DAG session (workloads.dag) runs stage by stage: a fan-out's children go out together on
connections of their own and the join waits for the last; a child that is a chain (a branch)
sends its steps in order on its connection, each at the previous one's end plus its think time,
and the join waits for the last step of every branch. ``loadgen.engine.conversation`` says what each
step sends. Every record carries the step's id, kind, parents and depth.
"""

from __future__ import annotations

import itertools
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gevent

from analysis.records import CUT_AT_STOP, STATUS_ERROR, STATUS_OK, RequestRecord
from loadgen.engine.client import SessionConnection, StreamResult, check_reply
from loadgen.engine.client import output_tokens as count_output_tokens
from loadgen.engine.connection_pool import ConnectionPool
from loadgen.engine.conversation import Conversation, tool_definitions
from targets.adapters.base import Adapter, ChatRequest
from workloads.dag import SessionPlan, Step, plan_session
from workloads.model import Session, turn_class


@dataclass
class SessionContext:
    """What every session of a worker shares: the target, the clock anchor and the sinks."""

    run_id: str
    worker_id: str
    base_url: str
    adapter: Adapter
    model: str | None
    target_label: str
    session_header: str
    request_timeout_s: float
    connect_timeout_s: float
    api_key: str | None
    extra_headers: dict[str, str]
    t0_ns: int  # perf_counter_ns of the run start on this worker
    on_record: Callable[[RequestRecord], None]
    is_stopping: Callable[[], bool]
    in_flight: InFlight
    # More SessionConnection keywords: first-byte/idle timeouts, Retry-After cap, TLS context.
    connection_options: dict[str, Any] = field(default_factory=dict)
    # The workload's tokenizer (workloads.text): counts each request's prompt contents, and the
    # output of a reply without usage when it is an exact one (--tokenizer).
    tokenizer: Any = None
    # Where sessions take their connections and leave them (--connections); None: each session
    # opens and closes its own.
    connections: ConnectionPool | None = None


class InFlight:
    """Counts requests on the wire and sessions alive, and which sessions they are."""

    def __init__(self) -> None:
        self.requests = 0
        self.sessions: set[str] = set()


def sleep_until_ns(t_ns: int) -> None:
    """Sleep to a perf_counter_ns instant; gevent timers wake ~1 ms late, so re-check the clock."""
    while True:
        remaining = t_ns - time.perf_counter_ns()
        if remaining <= 0:
            return
        gevent.sleep(remaining / 1e9)


def cold_nonce(run_id: str, session_id: str, turn_index: int) -> str:
    """A one-token word unique to (run, session, turn): no engine cache can make the prompt warm."""
    return "n" + format(zlib.crc32(f"{run_id}/{session_id}/{turn_index}".encode()), "07x")[:7]


def run_session(
    ctx: SessionContext, session: Session, t_sched_ns: int, conn: SessionConnection | None = None
) -> None:
    """Replay ``session`` with its first step intended at ``t_sched_ns`` (perf_counter_ns).
    ``conn``: the connection its steps go over, taken for it (else it takes its own).

    Stages run in order (workloads.dag): a plain step is intended at the previous stage's end
    plus its ``think_time_s``; a fan-out's children start together, each on its own keep-alive
    connection, and the next step waits for the last of them. A failed step ends the session.
    """
    plan = plan_session(session)
    conversation = Conversation(session, plan, ctx.tokenizer.count if ctx.tokenizer is not None else None)
    tools = tool_definitions(session) if ctx.adapter.accepts_tools else []
    conns = [conn if conn is not None else _connection(ctx)]
    ctx.in_flight.sessions.add(session.session_id)
    prev_end_ns = t_sched_ns
    try:
        if time.perf_counter_ns() < t_sched_ns:
            conns[0].preconnect()
        for n, stage in enumerate(plan.stages):
            if not stage.fan_out:
                step = stage.steps[0]
                turn = session.turns[step.index]
                intended_ns = t_sched_ns if n == 0 else prev_end_ns + int(turn.think_time_s * 1e9)
                result = _send_step(ctx, session, plan, conversation, step.index, conns[0], intended_ns, tools)
                if result is None:
                    return
                if n + 1 < len(plan.stages):  # the last reply is history for nothing: not counted
                    conversation.extend(step.index, result.text)
                prev_end_ns = result.t_end_ns or time.perf_counter_ns()
                continue
            branches = stage.branches
            while len(conns) < len(branches):
                conns.append(_connection(ctx))
            children = [
                gevent.spawn(
                    _send_step, ctx, session, plan, conversation, branch[0].index, conns[j],
                    prev_end_ns + int(session.turns[branch[0].index].think_time_s * 1e9), tools,
                )
                if len(branch) == 1 else
                gevent.spawn(_run_branch, ctx, session, plan, conversation, branch, conns[j], prev_end_ns, tools)
                for j, branch in enumerate(branches)
            ]  # fmt: skip
            # Each request has its own deadline; this bounds the join on top of them.
            longest_s = max(
                sum(session.turns[s.index].think_time_s + ctx.request_timeout_s for s in branch) for branch in branches
            )
            try:
                gevent.joinall(children, timeout=longest_s + 5.0)
            except BaseException:
                # This session is being killed (the stop's deadline): its children, which are no
                # greenlets of the driver's pool, go with it and record what was on the wire.
                gevent.killall(children, block=True, timeout=5.0)
                raise
            if not all(g.ready() for g in children):
                gevent.killall(children, block=True, timeout=5.0)
                return
            results = [g.value for g in children]
            if any(r is None for r in results):
                return
            conversation.join([branch[0].index for branch in branches], [r.text for r in results])
            prev_end_ns = max(r.t_end_ns or time.perf_counter_ns() for r in results)
    finally:
        ctx.in_flight.sessions.discard(session.session_id)
        pool = ctx.connections
        for conn in conns:
            if pool is None:
                conn.close()
            else:
                pool.give(conn)


def _run_branch(
    ctx: SessionContext,
    session: Session,
    plan: SessionPlan,
    conversation: Conversation,
    branch: tuple[Step, ...],
    conn: SessionConnection,
    start_ns: int,
    tools: list[dict[str, Any]],
) -> StreamResult | None:
    """Send a branch's steps in order on ``conn``, each intended at the previous one's end (the
    fan-out's parent's, ``start_ns``, for the first) plus its think time; the last step's result,
    or None when a step did not succeed (the branch, like the session, cannot go on)."""
    prev_end_ns = start_ns
    result = None
    for j, step in enumerate(branch):
        intended_ns = prev_end_ns + int(session.turns[step.index].think_time_s * 1e9)
        result = _send_step(ctx, session, plan, conversation, step.index, conn, intended_ns, tools)
        if result is None:
            return None
        if j + 1 < len(branch):  # the last reply goes back to the parent at the join instead
            conversation.extend_branch(step.index, result.text)
        prev_end_ns = result.t_end_ns or time.perf_counter_ns()
    return result


def _connection(ctx: SessionContext) -> SessionConnection:
    if ctx.connections is not None:
        return ctx.connections.take()
    return new_connection(ctx)


def new_connection(ctx: SessionContext) -> SessionConnection:
    """A new, unconnected connection to the run's target with the run's options."""
    return SessionConnection(
        ctx.base_url,
        connect_timeout_s=ctx.connect_timeout_s,
        api_key=ctx.api_key,
        extra_headers=ctx.extra_headers,
        **ctx.connection_options,
    )


def _send_step(
    ctx: SessionContext,
    session: Session,
    plan: SessionPlan,
    conversation: Conversation,
    k: int,
    conn: SessionConnection,
    intended_ns: int,
    tools: list[dict[str, Any]],
) -> StreamResult | None:
    """Send step ``k`` at ``intended_ns`` and record it; its result, or None when it did not
    succeed (or the run is stopping): the session cannot go on without the reply."""
    sleep_until_ns(intended_ns)
    if ctx.is_stopping():
        return None
    to_send = conversation.messages_for(k)
    turn = session.turns[k]
    if turn.cold:
        # The nonce leads the whole prompt, so no cached prefix (not even the system
        # prompt) can match; it is sent once and never kept in the history.
        to_send = [dict(m) for m in to_send]
        nonce = cold_nonce(ctx.run_id, session.session_id, k)
        to_send[0]["content"] = f"{nonce} {to_send[0]['content']}"
    request_id = f"{ctx.run_id}-{session.index}-{k}"
    prepared = ctx.adapter.build_request(
        ChatRequest(
            messages=to_send,
            max_tokens=turn.max_tokens,
            session_id=session.session_id,
            request_id=request_id,
            model=ctx.model,
            session_header=ctx.session_header,
            extra_body={"tools": tools} if tools else None,
        )
    )
    ctx.in_flight.requests += 1
    conn.current = None
    try:
        result = conn.stream(prepared, ctx.adapter, deadline_s=ctx.request_timeout_s)
    except gevent.GreenletExit:
        # Killed on the wire: by the stop once its drain deadline passed, or by a fan-out join's
        # deadline. A request that left has reached the server: it gets its record, with what
        # arrived, so requests.jsonl holds one line for every request the server received.
        cut = conn.current
        if cut is not None and cut.t_send_ns:
            _record_cut(ctx, session, plan, conversation, k, request_id, intended_ns, cut, prepared.held_messages)
        raise
    finally:
        ctx.in_flight.requests -= 1
    return _finish_step(ctx, session, plan, conversation, k, request_id, intended_ns, result, prepared.held_messages)


def _record_cut(
    ctx: SessionContext,
    session: Session,
    plan: SessionPlan,
    conversation: Conversation,
    k: int,
    request_id: str,
    intended_ns: int,
    cut: StreamResult,
    held_messages: int = 0,
) -> None:
    cut.t_end_ns = time.perf_counter_ns()
    got = f"{len(cut.chunk_ns)} token chunks had arrived"
    if ctx.is_stopping():
        cut.error_category = CUT_AT_STOP
        cut.error_message = f"still on the wire when the stop's drain deadline passed; {got}"
    else:
        cut.error_category = "timeout"
        cut.error_message = f"a fan-out's join deadline passed while it was on the wire; {got}"
    _finish_step(ctx, session, plan, conversation, k, request_id, intended_ns, cut, held_messages)


def _finish_step(
    ctx: SessionContext,
    session: Session,
    plan: SessionPlan,
    conversation: Conversation,
    k: int,
    request_id: str,
    intended_ns: int,
    result: StreamResult,
    held_messages: int = 0,
) -> StreamResult | None:
    """Record step ``k``'s outcome; its result when it succeeded, else None. ``held_messages``:
    of its conversation, the messages the server held (``PreparedRequest.held_messages``)."""
    turn = session.turns[k]
    rec = _record(ctx, session, k, turn.max_tokens, request_id, intended_ns, result)
    step = plan.steps[k]
    rec.step_id = step.step_id
    rec.step_kind = step.kind
    rec.parent_ids = list(step.parent_ids)
    rec.depth = step.depth
    rec.session_steps = len(plan.steps)
    prompt_tokens = conversation.prompt_tokens(k)
    if prompt_tokens is not None and turn.cold:
        prompt_tokens += ctx.tokenizer.count(cold_nonce(ctx.run_id, session.session_id, k))
    rec.client_prompt_tokens = prompt_tokens
    if held_messages:  # server-side history: of the prompt, what the server held and was not sent
        rec.server_held_prompt_tokens = conversation.held_tokens(held_messages, k)
    ctx.on_record(rec)
    return result if rec.ok else None


def _us(t_ns: int | None, t0_ns: int) -> int | None:
    return None if t_ns is None else (t_ns - t0_ns) // 1000


def _record(
    ctx: SessionContext,
    session: Session,
    turn_index: int,
    max_tokens: int,
    request_id: str,
    intended_ns: int,
    result: StreamResult,
) -> RequestRecord:
    t0 = ctx.t0_ns
    check_reply(result, max_tokens)  # a successful reply without a token is an empty_reply failure
    chunk_ns = result.chunk_ns
    itl_us = [(b - a) // 1000 for a, b in itertools.pairwise(chunk_ns)]
    usage = result.usage
    completion = usage.completion_tokens if usage is not None else None
    chunk_tokens = result.chunk_tokens
    n_chunks = len(chunk_ns)
    counted = sum(chunk_tokens)
    if chunk_tokens or completion is not None:
        # usage where it is at least what the chunks carried, else the chunks (docs/metrics.md)
        output_tokens = count_output_tokens(completion, chunk_tokens)
    elif ctx.tokenizer is not None and ctx.tokenizer.kind != "approximate" and result.text:
        output_tokens = ctx.tokenizer.count(result.text)  # an exact tokenizer beats counting chunks
    else:
        output_tokens = n_chunks
    ok = result.error_category is None
    t_sched_us = (intended_ns - t0) // 1000
    # Never sent (the connect failed): no send time, so none is made up (docs/results-format.md).
    sent = result.t_send_ns != 0
    return RequestRecord(
        request_id=request_id,
        session_id=session.session_id,
        session_index=session.index,
        turn_index=turn_index,
        turn_class=turn_class(turn_index),
        tenant=session.tenant,
        target=ctx.target_label,
        worker=ctx.worker_id,
        status=STATUS_OK if ok else STATUS_ERROR,
        t_sched_us=t_sched_us,
        t_send_us=(result.t_send_ns - t0) // 1000 if sent else t_sched_us,
        t_first_us=_us(result.t_first_ns, t0),
        t_last_us=_us(chunk_ns[-1] if chunk_ns else None, t0),
        t_end_us=_us(result.t_end_ns, t0),
        output_tokens=output_tokens,
        chunks=n_chunks,
        usage_completion_tokens=completion,
        prompt_tokens=usage.prompt_tokens if usage is not None else None,
        cached_tokens=usage.cached_tokens if usage is not None else None,
        max_tokens=max_tokens,
        itl_us=itl_us,
        chunk_tokens=None if not chunk_tokens or all(n == 1 for n in chunk_tokens) else list(chunk_tokens),
        error_category=result.error_category,
        error_message=result.error_message,
        http_status=result.http_status,
        server_timings=result.server_timings,
        throttled=result.throttled,
        chunk_output_tokens=counted,
        sent=sent,
        t_first_output_us=_us(result.t_first_output_ns, t0),
        reasoning_tokens=min(result.reasoning_tokens, output_tokens),
    )
