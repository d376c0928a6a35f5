"""A worker that stops hearing its master stops sending load and exits by itself.

Locust's master answers each worker heartbeat (sent every second) with one of its own. A master
killed with SIGKILL, or cut off by the network, answers nothing; stock Locust workers then go on
sending load for a full minute (``MASTER_HEARTBEAT_TIMEOUT``) with nobody recording it.

The watch counts *checks*, not wall time: a check runs every ``CHECK_INTERVAL_S`` and counts one
miss when no heartbeat came since the previous check. A worker that was itself paused (SIGSTOP,
a VM freeze) wakes up to a single check, not to a long silence, so it carries on when its master
is still there; only ``MISSED_CHECKS_LIMIT`` checks in a row without an answer mean the master is
gone (``--master-loss-timeout``, default 15 s). Armed by the first heartbeat: connecting to the
master has its own deadline in Locust.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import gevent

from loadgen.runtime.loss_timeouts import DEFAULT_MASTER_LOSS_TIMEOUT_S, HEARTBEAT_INTERVAL_S, missed_checks

log = logging.getLogger("loadgen")

CHECK_INTERVAL_S = HEARTBEAT_INTERVAL_S
# The default --master-loss-timeout in silent checks: a master busy for seconds (a large merge, a
# slow disk) is not lost; it always exceeds the master's --worker-loss-timeout by a margin, so in
# a partition the master counts the worker lost first (loadgen/runtime/loss_timeouts.py).
MISSED_CHECKS_LIMIT = missed_checks(DEFAULT_MASTER_LOSS_TIMEOUT_S)


class MasterWatch:
    """Calls ``on_master_lost(silent_s)`` when ``missed_limit`` checks in a row saw no heartbeat."""

    def __init__(
        self,
        environment: Any,
        on_master_lost: Callable[[float], None],
        *,
        interval_s: float = CHECK_INTERVAL_S,
        missed_limit: int = MISSED_CHECKS_LIMIT,
    ) -> None:
        self.env = environment
        self.on_master_lost = on_master_lost
        self.interval_s = interval_s
        self.missed_limit = missed_limit
        self.armed = False
        self.missed = 0
        self._heard = False
        self._greenlet: gevent.Greenlet | None = None

    def install(self) -> MasterWatch:
        self.env.events.heartbeat_received.add_listener(self._on_heartbeat)
        self._greenlet = gevent.spawn(self._watch)
        return self

    def _on_heartbeat(self, **_: Any) -> None:
        self.armed = True
        self._heard = True

    def _watch(self) -> None:
        while True:
            gevent.sleep(self.interval_s)
            if self.check():
                silent_s = self.missed * self.interval_s
                # Disarmed until the next heartbeat: a master that comes back (a long pause)
                # is watched again, and one that does not is reported once.
                self.armed, self.missed = False, 0
                self.on_master_lost(silent_s)

    def check(self) -> bool:
        """One check; True when the master counts as lost (pure bookkeeping, no sleeping)."""
        if not self.armed:
            return False
        if self._heard:
            self._heard = False
            self.missed = 0
            return False
        self.missed += 1
        return self.missed >= self.missed_limit


def install_master_watch(
    environment: Any, on_master_lost: Callable[[float], None], master_loss_timeout_s: float = DEFAULT_MASTER_LOSS_TIMEOUT_S
) -> MasterWatch:
    """Start watching the master's heartbeats on a worker (see the module docstring): the master
    is lost after ``master_loss_timeout_s`` of silent checks."""
    return MasterWatch(environment, on_master_lost, missed_limit=missed_checks(master_loss_timeout_s)).install()


__all__ = ["CHECK_INTERVAL_S", "MISSED_CHECKS_LIMIT", "MasterWatch", "install_master_watch"]
