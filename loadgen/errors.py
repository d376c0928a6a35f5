"""The one exception type for mistakes a user can fix (bad flag, bad file, wrong server).

Library code raises it with a message that names the thing, the value and the fix, e.g.
``workload.yaml line 37: think_time 'fast' is not a duration; use e.g. 2s``. It is a plain
exception, so the engine that raises it needs no command-line library; the one place that turns
it into the CLI's ``Error: <message>`` line and exit 2 is ``loadgen.cli.LoadgenGroup``.
"""

from __future__ import annotations

USAGE_EXIT_CODE = 2


class UserError(Exception):
    """A mistake the user can fix; ``message`` is the one line the user sees."""

    exit_code = USAGE_EXIT_CODE

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message
