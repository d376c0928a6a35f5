"""The one exception type for mistakes a user can fix (bad flag, bad file, wrong server).

Library code raises it with a message that names the thing, the value and the fix, e.g.
``workload.yaml line 37: think_time 'fast' is not a duration; use e.g. 2s``. It is a plain
exception, so the engine that raises it needs no command-line library; the one place that turns
it into the CLI's ``Error: <message>`` line and exit 2 is ``loadgen.cli.LoadgenGroup`` (and,
inside a Locust process, the runtime's start of a run).

The packages below loadgen raise their own one-line errors for what a user can fix: a workload
(``WorkloadError``), a target (``TargetError``), a results directory (``ResultsError``).
``as_user_error`` is the one place they become user errors; anything else, a plain
``ValueError`` included, is a bug and stays one (a traceback, never a usage error).
"""

from __future__ import annotations

import sys

USAGE_EXIT_CODE = 2


class UserError(Exception):
    """A mistake the user can fix; ``message`` is the one line the user sees."""

    exit_code = USAGE_EXIT_CODE

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


# (module, class) of every library error that is the user's to fix; looked up in sys.modules, so
# nothing is imported here: an error of a module not yet imported cannot have been raised.
LIBRARY_USER_ERRORS = (
    ("workloads.errors", "WorkloadError"),
    ("targets.errors", "TargetError"),
    ("analysis.errors", "ResultsError"),
)


def as_user_error(e: BaseException) -> UserError | None:
    """``e`` as a ``UserError`` if it is one, or one of ``LIBRARY_USER_ERRORS``; else None (a bug)."""
    if isinstance(e, UserError):
        return e
    for module, name in LIBRARY_USER_ERRORS:
        loaded = sys.modules.get(module)
        if loaded is not None and isinstance(e, getattr(loaded, name)):
            return UserError(str(e))
    return None
