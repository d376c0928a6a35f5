"""The one exception type ``analysis`` raises for problems a user can fix.

``ResultsError`` is a ``ValueError`` whose message is one line naming the file (or the run) and
what to do, e.g. ``results/x/run.json: schema_version 3 is newer than this loadgen understands
(1); upgrade loadgen``. The CLI prints it and exits 2; library callers may catch ``ValueError``.
"""

from __future__ import annotations


class ResultsError(ValueError):
    """A results directory (or a pair of them) that cannot be analysed as asked."""


__all__ = ["ResultsError"]
