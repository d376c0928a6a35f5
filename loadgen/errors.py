"""The one exception type for mistakes a user can fix (bad flag, bad file, wrong server).

It is a ``click.ClickException``: the CLI prints ``Error: <message>`` on one line and exits 2.
Library code raises it with a message that names the thing, the value and the fix, e.g.
``workload.yaml line 37: think_time 'fast' is not a duration; use e.g. 2s``.
"""

from __future__ import annotations

import click

USAGE_EXIT_CODE = 2


class UserError(click.ClickException):
    exit_code = USAGE_EXIT_CODE
