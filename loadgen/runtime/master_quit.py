"""A master that quits as soon as its workers have, not half a second later, twice.

Locust's ``MasterRunner.quit`` sends every worker ``quit`` and then sleeps a fixed 0.5 s "for
the final stats report", and a headless master's shutdown calls it a second time: every run
ended a second after its last record was written. A worker answers ``quit`` with its last stats
report and then its own ``quit`` message, on which the master forgets it, so waiting until no
connected worker is left waits for exactly what the sleep stood in for. A worker that is missing
(no heartbeats) never answers: for those the wait is the old half second at most.
"""

from __future__ import annotations

import time
from typing import Any

import gevent
from locust.rpc import Message
from locust.runners import STATE_MISSING, MasterRunner

__all__ = ["QUIT_WAIT_S", "install_prompt_quit"]

QUIT_WAIT_S = 0.5  # Locust's own fixed wait, now the longest one


def install_prompt_quit(runner: MasterRunner) -> None:
    """Replace ``runner.quit`` (this instance only) with one that waits for the workers' goodbyes."""

    def quit() -> None:
        runner.stop(send_stop_to_client=False)
        for client in runner.clients.all:
            runner.server.send_to_client(Message("quit", None, client.id))
        deadline = time.monotonic() + QUIT_WAIT_S
        while _connected(runner) and time.monotonic() < deadline:
            gevent.sleep(0.005)
        runner.greenlet.kill(block=True)

    runner.quit = quit


def _connected(runner: Any) -> bool:
    return any(c.state != STATE_MISSING for c in runner.clients.all)
