"""A worker's kept-alive connections between sessions: ``ConnectionPool``.

A session holds one keep-alive connection for its life: its turns go over it in order, and each
of a fan-out's children holds one of its own. What happens to that connection when the session
ends is the run's ``--connections``:

- ``pooled`` (the default): it waits, open, for the next session that starts on this worker, as
  an HTTP client's pool keeps it for the next request. Sessions of one turn then cost the server,
  the network and the generator no connect and no close each (on loopback a connect and close was
  ~9% of a 500-stream worker's CPU, and every closed connection leaves a socket in TIME_WAIT: tens
  of thousands of them cap how fast one client can open connections to one address).
- ``per-session``: it is closed, and the next session connects anew: a target's connection
  handling (its accept queue, a balancer that balances connections) is then part of the load.

Either way no connect is ever in a turn's TTFT: in open loop a session opens its connection, or
checks the one it took, ahead of its first turn (``SessionConnection.preconnect``); elsewhere
(closed loop, a fan-out's children) that check is the request's own. A kept connection is handed
on only when its last reply ended cleanly and allowed keep-alive (else ``SessionConnection`` closed
it already); one the server closed while it waited is found so then and replaced.

The most recently returned connection goes out first (it is the least likely to have met the
server's keep-alive timeout). Each return also looks at the one that waited longest and closes it
if the server closed its end, so half-closed sockets are cleared as sessions keep ending; however
few end, no more connections wait than the worker ever had sessions at once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from loadgen.config import CONNECTION_MODES

if TYPE_CHECKING:
    from loadgen.engine.client import SessionConnection

POOLED = CONNECTION_MODES[0]

__all__ = ["ConnectionPool"]


class ConnectionPool:
    """Connections for a worker's sessions: ``take`` one at a session's start, ``give`` it back at
    its end; ``close`` at the run's end. ``make`` builds a new (unconnected) one."""

    def __init__(self, make: Callable[[], SessionConnection], mode: str = POOLED) -> None:
        if mode not in CONNECTION_MODES:
            raise ValueError(f"connections must be one of {', '.join(CONNECTION_MODES)}, not {mode!r}")
        self._make = make
        self.mode = mode
        self._idle: deque[SessionConnection] = deque()
        self.handed_on = 0  # sessions that got a connection another session left
        self._connects = [0]  # TCP connects of every connection this pool made (each adds its own)

    def counts(self) -> dict[str, int]:
        """What a worker reports of its connections (run.json's ``connections``): TCP connections
        its sessions opened (one replaced counts again) and sessions that took a kept one."""
        return {"opened": self._connects[0], "handed_on": self.handed_on}

    def take(self) -> SessionConnection:
        """A connection for a new session: the last one returned, else a new one."""
        if self._idle:
            self.handed_on += 1
            return self._idle.pop()
        conn = self._make()
        conn.connect_count = self._connects
        return conn

    def take_open(self) -> SessionConnection | None:
        """A kept connection that is still open, for a session about to start: the last one
        returned whose server has not closed it (those it finds closed are closed); None when
        none waits."""
        idle = self._idle
        while idle:
            conn = idle.pop()
            if not conn.server_closed():
                self.handed_on += 1
                return conn
            conn.close()
        return None

    def untake(self, conn: SessionConnection) -> None:
        """``conn``, taken with ``take_open`` for a session that did not start, back as it was."""
        self.handed_on -= 1
        self.give(conn)

    def give(self, conn: SessionConnection) -> None:
        """A session is done with ``conn``: keep it for the next one when it is open and idle."""
        if self.mode != POOLED or not conn.is_idle_open():
            conn.close()
            return
        idle = self._idle
        if idle and idle[0].server_closed():
            idle.popleft().close()
        idle.append(conn)

    def close(self) -> None:
        """Close every waiting connection (the run ended; a later session opens its own)."""
        idle = self._idle
        while idle:
            idle.pop().close()

    @property
    def waiting(self) -> int:
        """Connections waiting for a session now (not ``__len__``: an empty pool is still one)."""
        return len(self._idle)
