"""The relay's exchange events through a real pipe to the recorder: each exchange settled once,
however it ended, and a feed that sheds instead of growing when nobody reads the pipe."""

from __future__ import annotations

import asyncio
import os
import time

import orjson

from loadgen.capture.assembly import CHAT, SessionAssembler
from loadgen.capture.feed import (
    BEGIN,
    CHUNK,
    CLIENT_LEFT,
    END,
    HEAD,
    LEFT_BEFORE_HEAD,
    REPLIED,
    UNREACHABLE,
    UPSTREAM_BROKE,
    ExchangeFeed,
    decode_frames,
    encode_frame,
)
from loadgen.capture.recorder import ExchangeRecorder

SSE = "text/event-stream"
TOKEN = b'data: {"choices":[{"index":0,"delta":{"content":" x"}}]}\n\n'
DONE = b"data: [DONE]\n\n"


def _body(*users: str) -> bytes:
    msgs: list[dict] = [{"role": "system", "content": "s"}]
    for i, u in enumerate(users):
        if i:
            msgs.append({"role": "assistant", "content": "x x"})
        msgs.append({"role": "user", "content": u})
    return orjson.dumps({"messages": msgs, "stream": True})


def _exchange(
    xid: int, t_s: float, body: bytes, pieces: list[bytes], outcome: int, status: int = 200
) -> list:
    t = int(t_s * 1e9)
    events: list[tuple] = [(BEGIN, xid, t, CHAT, None, body), (HEAD, xid, status, SSE, "")]
    events += [(CHUNK, xid, t + 1000 * (i + 1), p) for i, p in enumerate(pieces)]
    return [*events, (END, xid, t + 10**6, outcome)]


def test_every_exchange_is_settled_once_whatever_its_end() -> None:
    rec = ExchangeRecorder(SessionAssembler(idle_timeout_s=60))
    events = (
        _exchange(1, 1.0, _body("a"), [TOKEN, TOKEN, DONE], REPLIED)
        + _exchange(2, 2.0, _body("a", "b"), [TOKEN], CLIENT_LEFT)  # cut before [DONE]
        + _exchange(3, 3.0, _body("a", "b"), [TOKEN, DONE], CLIENT_LEFT)  # left after it: whole
        + _exchange(4, 4.0, _body("a", "b", "c"), [TOKEN], UPSTREAM_BROKE)
        + _exchange(5, 5.0, _body("a", "b", "c"), [b"{}"], REPLIED, status=500)
        + [(BEGIN, 6, 6 * 10**9, CHAT, None, _body("z")), (END, 6, 6 * 10**9, UNREACHABLE)]
        + [(BEGIN, 7, 7 * 10**9, CHAT, None, b"not json"), (END, 7, 7 * 10**9, LEFT_BEFORE_HEAD)]
        + [(END, 3, 9 * 10**9, REPLIED)]  # a second end of a settled exchange changes nothing
        + [(BEGIN, 8, 8 * 10**9, CHAT, None, _body("a", "b", "c")), (HEAD, 8, 200, SSE, "")]
    )
    # Split anywhere: frames decode whole and in order.
    wire = bytearray()
    for i in range(0, len(events), 3):
        wire += encode_frame(events[i : i + 3])
    buf = bytearray()
    for i in range(0, len(wire), 7):
        buf += wire[i : i + 7]
        for batch in decode_frames(buf):
            rec.apply(batch)
    assert not buf and rec.open_exchanges == 1
    rec.abandon_open(9 * 10**9)  # the relay died with exchange 8 on the wire
    s = rec.assembler.stats
    assert (s.requests, s.turns, s.cut, s.failed, s.not_recorded) == (8, 2, 2, 3, 1)
    assert rec.exchanges == 8 and rec.open_exchanges == 0
    (conv,) = rec.assembler.take_closed(10.0, everything=True)
    assert [(t.content, t.max_tokens) for t in conv.turns] == [("a", 2), ("b", 1)]


async def read_events_to_end(read_fd: int) -> list[tuple]:
    """Every event a feed wrote to the pipe ``read_fd`` (non-blocking) until it closed it; closes it."""
    got = bytearray()
    while True:
        await asyncio.sleep(0.001)
        try:
            data = os.read(read_fd, 1 << 20)
        except BlockingIOError:
            continue
        if not data:
            break
        got += data
    os.close(read_fd)
    return [e for batch in decode_frames(got) for e in batch]


def test_a_feed_nobody_reads_sheds_bodies_and_pieces_and_says_so() -> None:
    async def main() -> list[tuple]:
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        feed = ExchangeFeed(max_unsent_bytes=4 << 20)
        await feed.connect(write_fd)
        t = time.monotonic_ns()
        big = _body("y" * (8 << 20))  # more than the pipe and the limit hold together
        first = feed.begin(t, CHAT, "k", big)
        feed.head(first, 200, SSE, "")
        feed.flush()
        assert feed.shedding  # nothing reads the pipe yet
        second = feed.begin(t, CHAT, "k2", _body("q"))
        feed.chunk(first, t, TOKEN)
        feed.chunk(second, t, TOKEN)
        feed.end(first, t, REPLIED)
        feed.end(second, t, REPLIED)
        feed.close()
        return await read_events_to_end(read_fd)

    events = asyncio.run(main())
    begins = {e[1]: e[5] for e in events if e[0] == BEGIN}
    assert begins[1] is not None and begins[2] is None  # the second came while the pipe was full
    assert not [e for e in events if e[0] == CHUNK]
    rec = ExchangeRecorder(SessionAssembler(idle_timeout_s=60))
    rec.apply(events)
    s = rec.assembler.stats
    assert (rec.shed, s.requests, s.turns, s.failed, s.not_recorded) == (2, 2, 0, 1, 1)
