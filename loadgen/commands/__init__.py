"""The commands: one module per ``loadgen`` command (and the helpers only commands use).

The CLI (``loadgen.cli``) imports a command's module when that command runs, so ``loadgen --help``
loads none of them; nothing below the commands imports them (a test checks).
"""

from __future__ import annotations

# Submodules, not names re-exported from them: a package attribute named like a submodule would
# be replaced by the module as soon as that submodule is imported.
__all__ = [
    "ab",
    "compare",
    "demo",
    "evalset",
    "power_scrape",
    "predict",
    "quality",
    "report",
    "run",
    "server_scrape",
    "sweep",
    "workload",
]
