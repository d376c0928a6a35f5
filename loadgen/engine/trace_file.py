"""The ``--trace`` file of a run, on this host: the user's path, or the master's copy of it.

A worker whose host lacks the file gets its text in the plan (``RunConfig.trace_text``) and reads
it from a temporary file; the whole-file schedule (``driver.global_schedule``) and the streamed
one (``plan_stream``) both read the trace through here.
"""

from __future__ import annotations

import os
import tempfile

from loadgen.config import RunConfig
from loadgen.errors import UserError


def trace_path_here(cfg: RunConfig) -> str:
    """A path to the run's trace that exists on this host (the plan's copy written to a temporary file when the path is not here)."""
    if cfg.trace_text is not None and not (cfg.trace_path and os.path.exists(cfg.trace_path)):
        suffix = os.path.splitext(cfg.trace_path or "trace.txt")[1]
        fd, path = tempfile.mkstemp(prefix="loadgen-trace-", suffix=suffix)
        with os.fdopen(fd, "w") as f:
            f.write(cfg.trace_text)
        return path
    if not cfg.trace_path:
        raise UserError("--arrival trace needs --trace FILE")
    return cfg.trace_path
