"""Locust's own messages wait for the join secret too (docs/distributed.md, "Who may join").

Locust's master sends its start message (``spawn``: the master's options, the target URL, the
workload, the rate) to every client in ``runner.clients``, and a client enters that list with its
``client_ready``, before loadgen's challenge can be answered. So on a master that requires the
join secret, a ``client_ready`` from a client that has not proved it is held back: the client
gets Locust's ``ack`` (its connect waits for it, and only then does a worker listen for the
challenge) and loadgen's challenge, and nothing else. Once it proves the secret, its held
``client_ready`` goes to Locust, which lists it and, mid-run, dispatches to it as to any worker.
Until then Locust does not know it: no ``spawn``, no heartbeat answers, no ``stop``. When the
master quits, the clients still held are told to quit too, as Locust tells its workers.

Every message must also come from the connection of the client it names: a message whose
``node_id`` is not the ZeroMQ identity it arrived on is dropped (logged once per identity), so no
peer can speak as a worker that proved the secret.

Locust offers no hook before its ``client_ready`` handling, so this wraps ``handle_message`` on
the one master runner (an instance attribute; the class and other runners are untouched).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from loadgen.runtime.join_auth import hostname_of

log = logging.getLogger("loadgen")

__all__ = ["JoinGate", "install_join_gate"]


class JoinGate:
    """Holds back Locust's ``client_ready`` of clients for which ``admitted(id)`` is False."""

    def __init__(self, runner: Any, admitted: Callable[[str], bool]) -> None:
        self.runner = runner
        self._admitted = admitted
        self._locust_handle_message = runner.handle_message
        self.held: dict[str, Any] = {}  # client id -> its client_ready, until it proves the secret
        self._spoof_logged: set[str] = set()

    def install(self) -> JoinGate:
        self.runner.handle_message = self._handle_message
        return self

    def _handle_message(self, client_id: str, msg: Any) -> None:
        if msg.node_id != client_id:
            if client_id not in self._spoof_logged:
                self._spoof_logged.add(client_id)
                log.warning("client %s sent a message as %s: dropped (a client speaks only for itself)", client_id, msg.node_id)
            return
        if msg.type == "client_ready" and not self._admitted(client_id):
            self._hold(client_id, msg)
            return
        if msg.type == "quit":
            self.held.pop(client_id, None)
        self._locust_handle_message(client_id, msg)

    def _hold(self, client_id: str, msg: Any) -> None:
        log.info("client %s from %s connected; it must prove the join secret", client_id, hostname_of(client_id))
        self.held[client_id] = msg
        # The worker's connect waits for this ack (as Locust sends it), and then listens for the challenge.
        self.runner.send_message("ack", client_id=client_id, data={"index": self.runner.get_worker_index(client_id)})
        self.runner.environment.events.worker_connect.fire(client_id=client_id)

    def quit_held(self) -> None:
        """The master is quitting: the clients it never admitted go too (a refused worker would
        otherwise wait for a master that never answers it)."""
        for client_id in list(self.held):
            self.runner.send_message("quit", client_id=client_id)

    def admit(self, client_id: str) -> None:
        """``client_id`` proved the secret: Locust gets its ``client_ready`` now."""
        msg = self.held.pop(client_id, None)
        if msg is not None:
            self._locust_handle_message(client_id, msg)


def install_join_gate(runner: Any, admitted: Callable[[str], bool]) -> JoinGate:
    return JoinGate(runner, admitted).install()
