"""The engine that times tokens: connections, the stream reader, sessions, the open-loop driver, the
recorder and the generator's own health.

Nothing here imports Locust or click (a test checks): the engine is the part that must stay fast
and exact, and it runs the same under a Locust worker, a local run and a benchmark. See
docs/architecture.md for how its pieces fit."""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "Conversation": "conversation",
    "Delta": "recorder",
    "Driver": "driver",
    "GeneratorHealth": "health",
    "MetricsAggregate": "recorder",
    "Recorder": "recorder",
    "Schedule": "driver",
    "SessionConnection": "client",
    "SessionContext": "session",
    "StreamReader": "stream_reader",
    "StreamResult": "client",
    "StreamedSchedule": "plan_stream",
    "build_schedule": "driver",
    "kernel_stamps_agree": "kernel_clock",
    "run_session": "session",
    "streamed_schedule": "plan_stream",
    "worker_wall_time": "worker_clock",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    # Loaded on first use, so importing one module of this package does not import them all.
    if name in _EXPORTS:
        return getattr(import_module(f"loadgen.engine.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
