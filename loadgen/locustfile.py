"""loadgen's locustfile: ``locust -f <site-packages>/loadgen/locustfile.py --host URL ...``.

It registers loadgen's options with Locust's parser and attaches the runtime to the environment.
The user class only keeps Locust's run state honest: the open-loop driver runs in its own
greenlets per worker process (started by the plan), because arrivals must never wait on a user.
"""

from __future__ import annotations

import gevent
import locust.runners
from locust import User, events, task

from loadgen.runtime.locust_options import add_arguments
from loadgen.runtime.locust_runtime import install
from targets.fleet.procs import die_with_parent

# Workers ship histogram deltas and records with every report, and the master writes them on
# receipt: every 0.5 s keeps requests.jsonl within a second of the truth even if the run is
# killed (Locust's default is every 3 s).
locust.runners.WORKER_REPORT_INTERVAL = 0.5


@events.init_command_line_parser.add_listener
def _add_options(parser, **_kwargs) -> None:
    add_arguments(parser)


@events.init.add_listener
def _install(environment, **_kwargs) -> None:
    if isinstance(environment.runner, locust.runners.WorkerRunner):
        # A worker dies with the process that started it (the master forked it for
        # --processes, or `loadgen worker`), instead of sending load for a minute until
        # Locust notices the missing heartbeats.
        die_with_parent()
    install(environment)


class LLMDriverUser(User):
    """One per worker process (``-u`` = number of workers). Its task waits for this worker's driver."""

    @task
    def wait_for_driver(self) -> None:
        rt = getattr(self.environment, "loadgen", None)
        driver = rt.driver if rt is not None else None
        if driver is None:
            gevent.sleep(0.5)
        else:
            driver.done.wait(timeout=1.0)
            if driver.done.is_set():
                gevent.sleep(1.0)

    def wait_time(self) -> float:
        return 0.0
