"""The one exception type for a target that cannot be used as configured.

``targets`` does not import ``loadgen``; the CLI maps ``TargetError`` to its one-line, exit-2
``UserError``. The message names the target (its URL or adapter name), what was found and the
likely fix, e.g. ``cannot reach target http://127.0.0.1:9/: connection refused; is the server
running?``.
"""

from __future__ import annotations


class TargetError(ValueError):
    """A target, adapter or adapter option is unusable; ``str()`` is the one-line message."""
