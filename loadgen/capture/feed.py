"""What the relay tells the assembler process: exchanges as events, sent over a pipe in batches.

The relay only moves bytes; everything it knows about a recorded exchange (``POST`` of
``/v1/chat/completions`` or ``/v1/completions``) goes to the assembler process as events, in the
order they happened:

* ``(BEGIN, xid, t_ns, endpoint, session_key, body)``: the request arrived (``t_ns``, monotonic)
  with this body (``None`` when the feed had to shed it, below);
* ``(HEAD, xid, status, content_type, content_encoding)``: the reply's head;
* ``(CHUNK, xid, t_ns, piece)``: a piece of the reply's body, sent to the client at ``t_ns``
  (stamped before the write, so never after the client had it);
* ``(END, xid, t_ns, outcome)``: the exchange is over, how (``OUTCOMES``).

Every ``BEGIN`` is followed by exactly one ``END``; ``xid`` is unique within one relay.

Wire format: frames of an 8-byte little-endian length and a pickled list of events (both ends are
this program; pickle is the cheapest encoding of tuples of bytes and ints). ``ExchangeFeed`` collects
events and writes one frame every ``FLUSH_INTERVAL_S``, so a relayed chunk costs a list append, not
a write. When the assembler falls behind and the pipe's unsent bytes pass ``MAX_UNSENT_BYTES``,
the feed sheds: new requests go without their bodies (not recorded), and replies already begun
stop sending pieces and end as ``SHED``, so the relay never holds more than that in memory.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import pickle
import struct
import sys
from collections.abc import Callable, Iterable, Iterator

BEGIN, HEAD, CHUNK, END = range(4)
# How an exchange ended (the END event's outcome).
REPLIED = 0  # the whole reply went to the client
CLIENT_LEFT = 1  # the client went away mid-reply
UPSTREAM_BROKE = 2  # the upstream broke off mid-reply
UNREACHABLE = 3  # the upstream could not be reached (the client got a 502)
LEFT_BEFORE_HEAD = 4  # the client went away before the reply's head
SHED = 5  # the feed dropped the reply's pieces: the assembler was too far behind
OUTCOMES = (REPLIED, CLIENT_LEFT, UPSTREAM_BROKE, UNREACHABLE, LEFT_BEFORE_HEAD, SHED)

FLUSH_INTERVAL_S = 0.005
MAX_UNSENT_BYTES = 64 * 1024 * 1024  # what a lagging assembler may cost the relay in memory
_FRAME_HEAD = struct.Struct("<Q")
_F_SETPIPE_SZ = 1031  # Linux: a bigger pipe rides out the assembler's file writes
PIPE_BYTES = 1 << 20


def encode_frame(events: list[tuple]) -> bytes:
    payload = pickle.dumps(events, protocol=pickle.HIGHEST_PROTOCOL)
    return _FRAME_HEAD.pack(len(payload)) + payload


def decode_frames(buf: bytearray) -> Iterator[list[tuple]]:
    """The whole frames at the start of ``buf``, removed from it as they are read."""
    pos = 0
    while len(buf) - pos >= _FRAME_HEAD.size:
        (n,) = _FRAME_HEAD.unpack_from(buf, pos)
        end = pos + _FRAME_HEAD.size + n
        if len(buf) < end:
            break
        yield pickle.loads(memoryview(buf)[pos + _FRAME_HEAD.size : end])
        pos = end
    del buf[:pos]


def enlarge_pipe(fd: int) -> None:
    """Best effort: the default 64 KiB fill while the assembler syncs the session file."""
    try:
        fcntl.fcntl(fd, _F_SETPIPE_SZ, PIPE_BYTES)
    except OSError:
        pass


class _PipeProtocol(asyncio.BaseProtocol):
    def __init__(self, feed: ExchangeFeed) -> None:
        self._feed = feed

    def connection_lost(self, exc: Exception | None) -> None:
        self._feed.lost()


class ExchangeFeed:
    """The relay's side: ``begin``/``head``/``chunk``/``end`` append events; a timer writes them.

    Without a pipe (``connect`` never called) events are counted and discarded, which is what an
    in-process proxy under test needs."""

    def __init__(self, *, max_unsent_bytes: int = MAX_UNSENT_BYTES) -> None:
        self.max_unsent_bytes = max_unsent_bytes
        self._events: list[tuple] = []
        self._transport: asyncio.WriteTransport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._next_xid = 0
        self._shed: set[int] = set()  # exchanges whose pieces are no longer sent
        self._closed = False
        # The pipe's unsent bytes were past max_unsent_bytes at the last flush (checked once a
        # flush, not once a piece).
        self.shedding = False
        self.broken = False  # the assembler process went away before we closed its pipe
        self.sent_events = 0
        # Set by the compiled pump: stops its recording and returns the exchanges it recorded.
        self.stop_recording: Callable[[], Iterable[int]] | None = None

    async def connect(self, fd: int) -> None:
        """Write to the pipe ``fd`` (the assembler process's stdin) from now on."""
        loop = asyncio.get_running_loop()
        enlarge_pipe(fd)
        # uvloop leaves a pipe as it finds it: a blocking write to a full pipe would stall every
        # relay until the assembler reads (seen as 10-17 ms loop stalls).
        os.set_blocking(fd, False)
        self._loop = loop
        self._transport, _ = await loop.connect_write_pipe(
            lambda: _PipeProtocol(self), os.fdopen(fd, "wb", buffering=0)
        )

    def begin(self, t_ns: int, endpoint: str, session_key: str | None, body: bytes) -> int:
        xid = self._next_xid = self._next_xid + 1
        if self.shedding:
            self._shed.add(xid)
            self._push((BEGIN, xid, t_ns, endpoint, session_key, None))
        else:
            self._push((BEGIN, xid, t_ns, endpoint, session_key, body))
        return xid

    def head(self, xid: int, status: int, content_type: str, content_encoding: str) -> None:
        self._push((HEAD, xid, status, content_type, content_encoding))

    def chunk(self, xid: int, t_ns: int, piece: bytes) -> None:
        if xid in self._shed:
            return
        if self.shedding:
            self._shed.add(xid)
            return
        self._push((CHUNK, xid, t_ns, piece))

    def end(self, xid: int, t_ns: int, outcome: int) -> None:
        if xid in self._shed:
            self._shed.discard(xid)
            if outcome in (REPLIED, UPSTREAM_BROKE, CLIENT_LEFT):
                outcome = SHED
        self._push((END, xid, t_ns, outcome))

    @property
    def events(self) -> list[tuple]:
        """The list events are collected in; it stays the same object for the feed's life, so
        the compiled pump (``pump.py``) appends its ``CHUNK`` events to it directly. Whoever
        appends calls ``added`` once after."""
        return self._events

    def piece_xid(self, xid: int) -> int:
        """``xid`` when the pieces of exchange ``xid`` are to be recorded now, else 0 (what
        ``chunk`` would drop: nothing recorded, or shed)."""
        if not xid or self._transport is None or self._closed or xid in self._shed:
            return 0
        if self.shedding:
            self._shed.add(xid)
            return 0
        return xid

    def added(self) -> None:
        """Events were appended to ``events`` from outside: the timer writes them."""
        if self._events and self._timer is None and self._loop is not None:
            self._timer = self._loop.call_later(FLUSH_INTERVAL_S, self.flush)

    def flush(self) -> None:
        """Write what was collected now (at shutdown; the timer does it otherwise)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        events = self._events.copy()  # (the list itself stays: see ``events``)
        self._events.clear()
        if not events or self._transport is None or self.broken:
            return
        self.sent_events += len(events)
        self._transport.write(encode_frame(events))
        self.shedding = self._transport.get_write_buffer_size() > self.max_unsent_bytes
        if self.shedding and self.stop_recording is not None:
            self._shed.update(self.stop_recording())

    def close(self) -> None:
        """Flush and close the pipe: the assembler process then writes everything and exits."""
        self.flush()
        self._closed = True
        if self._transport is not None:
            self._transport.close()

    def lost(self) -> None:
        if not self._closed and not self.broken:
            self.broken = True
            print(
                "capture: the session assembler process exited; proxying goes on, nothing more is recorded",
                file=sys.stderr,
                flush=True,
            )
        self._transport = None

    def _push(self, event: tuple) -> None:
        if self._transport is None or self._closed:  # (an exchange ending after the close is cut)
            return
        self._events.append(event)
        if self._timer is None:
            assert self._loop is not None
            self._timer = self._loop.call_later(FLUSH_INTERVAL_S, self.flush)
