"""The capture relay's compiled body pump (``loadgen/capture/_relay.c``) on the relay's event loop.

After the upstream's reply head, ``BodyPump.relay`` hands the rest of the body to the pump: one
``recv`` from the upstream, its de-framing, one ``send`` to the client and, for a recorded
exchange, one ``CHUNK`` event appended to the feed's list, all in C; the loop watches the pump's
epoll descriptor (``add_reader``) and Python wakes only for an exchange that ended. It takes the
place of ``proxy._ClientSink`` and the upstream connection's ``data_received`` for the body, which
stay as the reference and the fallback: for a TLS upstream, where the extension was not built, or
with ``LOADGEN_RELAY=python``.

The pump keeps each exchange's read deadline as the Python relay does: an upstream silent for the
read timeout while it is read is broken off, and a client that takes nothing of its unsent rest
for as long is cut (``expire``, checked a few times per timeout while anything is relayed).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import NamedTuple

from loadgen.capture.feed import CHUNK, ExchangeFeed
from loadgen.capture.upstream_connection import BODY_BROKE, BODY_DONE, BODY_DONE_NO_REUSE, BodyState

try:
    from loadgen.capture import _relay
except ImportError:  # no C compiler at install: the Python relay does it all
    _relay = None  # type: ignore[assignment]

# Which relay moves reply bodies; the capture's start line says it.
RELAY = "compiled" if _relay is not None and os.environ.get("LOADGEN_RELAY", "") != "python" else "python"


class PumpEnd(NamedTuple):
    """How a pumped body ended: ``body`` is the upstream connection's status (``BODY_*``), or
    None when the client went away (``client_stalled``: it stopped reading and is to be cut)."""

    body: int | None
    message: str | None
    client_stalled: bool = False


class BodyPump:
    """One ``_relay.Pump`` on the running loop, for one relay's exchanges."""

    def __init__(self, feed: ExchangeFeed, read_timeout_s: float) -> None:
        assert _relay is not None
        self._feed = feed
        self._read_timeout_s = read_timeout_s
        self._pump = _relay.Pump(feed.events, CHUNK)
        feed.stop_recording = self._pump.stop_recording
        self._waiting: dict[int, asyncio.Future[PumpEnd]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._expiry: asyncio.TimerHandle | None = None

    async def relay(self, body: BodyState, client_fd: int, out_chunked: bool, xid: int) -> PumpEnd:
        """Relay the rest of the body from ``body.fd`` to ``client_fd`` (in chunked framing when
        ``out_chunked``), recording its pieces under ``xid`` (0: none); return how it ended."""
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
            loop.add_reader(self._pump.fileno(), self._on_ready)
        framing = _relay.F_CHUNKED if body.chunked else _relay.F_CLOSE if body.to_close else _relay.F_LENGTH
        try:
            handle = self._pump.start(
                body.fd, client_fd, framing, body.left, body.chunk_state, body.carry, out_chunked,
                self._feed.piece_xid(xid), body.early,
            )  # fmt: skip
        except OSError as e:  # no descriptor left to dup: this exchange cannot go on
            return PumpEnd(BODY_BROKE, f"the relay could not take the reply ({e.strerror or e})")
        done = loop.create_future()
        self._waiting[handle] = done
        if self._expiry is None:
            self._expiry = loop.call_later(self._expiry_interval_s, self._expire)
        try:
            self._on_ready()  # the early body's send may have found the client gone
            return await done
        finally:
            self._waiting.pop(handle, None)
            self._pump.stop(handle)  # (cancelled: the pump lets go of both sockets)

    def close(self) -> None:
        if self._loop is not None:
            self._loop.remove_reader(self._pump.fileno())
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None

    @property
    def _expiry_interval_s(self) -> float:
        return min(1.0, self._read_timeout_s / 8)

    def _on_ready(self) -> None:
        ended = self._pump.run()
        self._feed.added()
        for handle, status, message in ended:
            self._settle(handle, status, message)

    def _expire(self) -> None:
        self._expiry = None
        timeout_ns = int(self._read_timeout_s * 1e9)
        for handle, status, message in self._pump.expire(time.monotonic_ns(), timeout_ns):
            self._settle(handle, status, message)
        if self._waiting and self._loop is not None:
            self._expiry = self._loop.call_later(self._expiry_interval_s, self._expire)

    def _settle(self, handle: int, status: int, message: str | None) -> None:
        done = self._waiting.get(handle)
        if done is None or done.done():
            return
        if status == _relay.ST_DONE:
            end = PumpEnd(BODY_DONE, None)
        elif status == _relay.ST_DONE_NO_REUSE:
            end = PumpEnd(BODY_DONE_NO_REUSE, None)
        elif status == _relay.ST_UPSTREAM:
            end = PumpEnd(BODY_BROKE, message)
        elif status == _relay.ST_UPSTREAM_SILENT:
            end = PumpEnd(BODY_BROKE, f"the upstream sent nothing for {self._read_timeout_s:g}s")
        elif status == _relay.ST_CLIENT_STALLED:
            end = PumpEnd(None, "the client stopped reading", client_stalled=True)
        else:
            end = PumpEnd(None, message or "the client left mid-reply")
        done.set_result(end)
