"""Errors raised for bad workload input.

``workloads`` does not import ``loadgen``; the CLI maps ``WorkloadError`` to its one-line,
exit-2 ``UserError``. The message always names the file (or spec), the key and what is allowed.
"""

from __future__ import annotations


class WorkloadError(ValueError):
    """A workload spec, session file or arrival option is invalid; ``str()`` is the one-line message."""
