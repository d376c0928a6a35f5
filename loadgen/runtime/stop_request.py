"""How ``loadgen run`` asks its Locust master to stop: one signal, taken by the runtime.

The front process (``loadgen.commands.run``) receives the user's Ctrl-C or a SIGTERM and sends the master
``STOP_SIGNAL``; the master's runtime (``loadgen.runtime.collector``) handles it in a greenlet of its own and
quits the runner, which is how a run that reaches its own end stops: the drain barrier, the final
reports, the results and the verdict, then Locust's one shutdown. Not SIGINT (Locust raises a
``KeyboardInterrupt`` in whichever greenlet happens to run) and not SIGTERM (Locust's handler runs
its shutdown a second time next to the main greenlet's).
"""

from __future__ import annotations

import signal
from collections.abc import Callable

__all__ = ["STOP_SIGNAL", "take_sigterm"]

STOP_SIGNAL = signal.SIGUSR1


def take_sigterm(callback: Callable[[], None]) -> None:
    """From now on SIGTERM to this process runs ``callback`` in a greenlet of its own, and Locust's
    own SIGTERM handler no longer does.

    Locust's handler shuts the process down at once: the quitting event, then ``sys.exit`` from the
    signal's greenlet, with no drain of the requests on the wire (and, with ``--processes``, a
    traceback from its atexit hook). A SIGTERM reaches the master or a worker when a whole process
    group is signalled (``timeout(1)``, a CI job cancelled, ``kill -- -PGID``), when a pod is
    deleted, or when the ``loadgen run`` front dies (its children get SIGTERM). Call this once the
    process runs (Locust installs its handler after the init event): the OS-level handler then is
    this one, which only schedules ``callback`` on the event loop.
    """
    import gevent

    hub = gevent.get_hub()

    def handler(_signum: int, _frame: object) -> None:
        hub.loop.run_callback_threadsafe(gevent.spawn, callback)

    signal.signal(signal.SIGTERM, handler)
