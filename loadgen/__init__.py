"""loadgen: load generation for LLM inference fleets, timed to the token.

The package is grouped by job (docs/architecture.md is the map):

- ``loadgen`` itself: the face and the ground everything stands on: the command line (``cli``),
  the run configuration and plan (``config``), the user-error type (``errors``), option parsers
  (``adapter_options``, ``target_file``), the lazy exports every package uses (``lazy_exports``) and
  the Locust entry file (``locustfile.py``).
- ``loadgen.engine``: times tokens (connections, stream reader, sessions, driver, recorder,
  health); imports neither Locust nor click.
- ``loadgen.live``: the views of a running test (web UI tabs, Prometheus endpoint, progress).
- ``loadgen.runtime``: loadgen inside Locust (plans, joins, losses, exchange, results, verdict).
- ``loadgen.capture``: the capture proxy and its assembler, a tool of its own.
- ``loadgen.commands``: one module per command, imported only by the CLI.

Imports point down that list's reverse (a test checks): commands → runtime → live → engine →
the ground. The names below load on first use, so ``import loadgen`` stays cheap.
"""

from __future__ import annotations

from loadgen.lazy_exports import lazy_getattr

_EXPORTS = {
    "Plan": "config",
    "RunConfig": "config",
    "USAGE_EXIT_CODE": "errors",
    "UserError": "errors",
    "main": "cli",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_getattr(__name__, _EXPORTS)
