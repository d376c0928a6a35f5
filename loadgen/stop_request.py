"""How ``loadgen run`` asks its Locust master to stop: one signal, taken by the runtime.

The front process (``loadgen.run``) receives the user's Ctrl-C or a SIGTERM and sends the master
``STOP_SIGNAL``; the master's runtime (``loadgen.runtime``) handles it in a greenlet of its own and
quits the runner, which is how a run that reaches its own end stops: the drain barrier, the final
reports, the results and the verdict, then Locust's one shutdown. Not SIGINT (Locust raises a
``KeyboardInterrupt`` in whichever greenlet happens to run) and not SIGTERM (Locust's handler runs
its shutdown a second time next to the main greenlet's).
"""

from __future__ import annotations

import signal

__all__ = ["STOP_SIGNAL"]

STOP_SIGNAL = signal.SIGUSR1
