"""The relay's exchange events (``feed.py``) turned into sessions: the assembler process's logic.

Pure: events in, ``SessionAssembler`` calls out, times taken from the events (the relay's
monotonic clock, shared by every process on the machine). Per exchange it does what the relay
once did inline: the request body's JSON goes to ``SessionAssembler.begin``; a 2xx reply's pieces
go to a ``ReplyMeter`` in order; the end records the turn (``complete``) if the reply was whole,
else drops it. A reply counts as whole when it ended cleanly, or when its stream's end marker
(``data: [DONE]``, or its API's own) had gone to the client before the client or the upstream
broke off; it ended when that marker went out (the body's end may come later), else at the body's end.

Each ``BEGIN`` is settled exactly once: by its ``END``, or by ``abandon_open`` when the relay that
sent it is gone (then it was cut, as a client leaving would have cut it).
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from loadgen.capture.assembly import SessionAssembler
from loadgen.capture.conversations import PendingTurn
from loadgen.capture.feed import (
    BEGIN,
    CHUNK,
    CLIENT_LEFT,
    END,
    HEAD,
    LEFT_BEFORE_HEAD,
    REPLIED,
    SHED,
    UPSTREAM_BROKE,
)
from loadgen.capture.reply import ReplyMeter


@dataclass(slots=True)
class _Open:
    pending: PendingTurn | None
    meter: ReplyMeter | None = None
    t_done_ns: int | None = None  # when the piece holding the stream's [DONE] went out


class ExchangeRecorder:
    """Applies events to a ``SessionAssembler``; ``shed`` counts replies the feed could not carry."""

    def __init__(self, assembler: SessionAssembler) -> None:
        self.assembler = assembler
        self._open: dict[int, _Open] = {}
        self.shed = 0
        self.exchanges = 0  # settled, recorded or not

    @property
    def open_exchanges(self) -> int:
        return len(self._open)

    def apply(self, events: list[tuple]) -> None:
        for event in events:
            kind = event[0]
            if kind == CHUNK:
                self._chunk(event[1], event[2], event[3])
            elif kind == BEGIN:
                self._begin(*event[1:])
            elif kind == HEAD:
                self._head(*event[1:])
            elif kind == END:
                self._end(*event[1:])

    def abandon_open(self, now_ns: int) -> None:
        """The relay is gone: every exchange still open was cut."""
        for xid in list(self._open):
            self._end(xid, now_ns, LEFT_BEFORE_HEAD)

    def _begin(self, xid: int, t_ns: int, endpoint: str, key: str | None, body: bytes | None) -> None:
        obj = None
        if body is not None:
            try:
                obj = orjson.loads(body)
            except orjson.JSONDecodeError:
                pass
        pending = self.assembler.begin(endpoint, obj, key, t_ns / 1e9)
        self._open[xid] = _Open(pending)

    def _head(self, xid: int, status: int, content_type: str, content_encoding: str) -> None:
        ex = self._open.get(xid)
        if ex is None or ex.pending is None or not 200 <= status < 300:
            return
        ex.meter = ReplyMeter(
            ex.pending.endpoint,
            content_type=content_type,
            content_encoding=content_encoding,
        )

    def _chunk(self, xid: int, t_ns: int, piece: bytes) -> None:
        ex = self._open.get(xid)
        meter = ex.meter if ex is not None else None
        if meter is None:
            return
        meter.feed(piece)
        if ex.t_done_ns is None and meter.stream_done:
            ex.t_done_ns = t_ns

    def _end(self, xid: int, t_ns: int, outcome: int) -> None:
        ex = self._open.pop(xid, None)
        if ex is None:
            return
        self.exchanges += 1
        pending, meter = ex.pending, ex.meter
        if outcome == SHED:
            self.shed += 1
        if pending is None:
            return
        done = meter is not None and meter.stream_done
        if outcome == REPLIED or (done and outcome in (CLIENT_LEFT, UPSTREAM_BROKE)):
            reply = meter.finish() if meter is not None else None
            if reply is not None:
                t_end_ns = ex.t_done_ns if ex.t_done_ns is not None else t_ns
                self.assembler.complete(
                    pending,
                    output_tokens=reply.output_tokens,
                    reply_text=reply.text,
                    now_s=t_end_ns / 1e9,
                    response_id=reply.response_id,
                    reply_calls=reply.calls,
                )
                return
            self.assembler.drop(pending, cut=False, now_s=t_ns / 1e9)
            return
        cut = outcome in (CLIENT_LEFT, LEFT_BEFORE_HEAD)
        self.assembler.drop(pending, cut=cut, now_s=t_ns / 1e9)
