"""Where a worker's messages really come from: the peer address of its connection.

A Locust client id is ``<hostname>_<uuid>``, and the hostname is whatever the worker claims. The
master's ROUTER socket knows better: ZeroMQ gives every received frame its connection's peer
address (``zmq.Frame.get("Peer-Address")``), but only on frames received without copying, and
Locust's ``rpc.Server.recv_from_client`` receives copies. So the master's one server gets a
receive that takes frames (``copy=False``), notes each client's address, and otherwise does what
Locust's does: the same message, the same errors. A server Locust rebuilds after a broken
connection (``reset_connection``) is wrapped again at the next look-up; until then an address
already seen stays known.
"""

from __future__ import annotations

from typing import Any

import msgpack.exceptions as msgerr
import zmq.error as zmqerr
from locust.exception import RPCError, RPCReceiveError
from locust.rpc.protocol import Message

__all__ = ["PeerAddresses"]


class PeerAddresses:
    """``address(client_id)``: the IP address the client's messages arrive from, once one has."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.by_client: dict[str, str] = {}
        self._wrapped: Any = None  # the server whose receive is ours

    def install(self) -> PeerAddresses:
        self._wrap()
        return self

    def address(self, client_id: str) -> str | None:
        self._wrap()
        return self.by_client.get(client_id)

    def _wrap(self) -> None:
        server = getattr(self.runner, "server", None)
        if server is None or server is self._wrapped or not hasattr(server, "socket"):
            return
        self._wrapped = server
        server.recv_from_client = lambda: self._recv_from_client(server)

    def _recv_from_client(self, server: Any) -> tuple[str, Any]:
        try:
            frames = server.socket.recv_multipart(copy=False)
            addr = frames[0].bytes.decode()
        except UnicodeDecodeError as e:
            raise RPCReceiveError("ZMQ interrupted or corrupted message") from e
        except zmqerr.ZMQError as e:
            raise RPCError("ZMQ network broken") from e
        if len(frames) < 2:
            raise RPCReceiveError("ZMQ interrupted or corrupted message", addr=addr)
        try:
            peer = frames[1].get("Peer-Address")
        except (zmqerr.ZMQError, ValueError):
            peer = None  # a transport without one: the claimed host is all there is
        if peer and self.by_client.get(addr) != peer:
            self.by_client[addr] = peer
        try:
            msg = Message.unserialize(frames[1].bytes)
        except (UnicodeDecodeError, msgerr.ExtraData) as e:
            raise RPCReceiveError("ZMQ interrupted or corrupted message", addr=addr) from e
        return addr, msg
