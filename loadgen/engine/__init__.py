"""The engine that times tokens: connections, the stream reader, sessions, the open-loop driver, the
recorder and the generator's own health.

Nothing here imports Locust or click (a test checks): the engine is the part that must stay fast
and exact, and it runs the same under a Locust worker, a local run and a benchmark. See
docs/architecture.md for how its pieces fit."""

from __future__ import annotations

from loadgen.lazy_exports import lazy_getattr

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
    "StreamResult": "outcome",
    "StreamedSchedule": "plan_stream",
    "build_schedule": "driver",
    "kernel_stamps_agree": "kernel_clock",
    "run_session": "session",
    "streamed_schedule": "plan_stream",
    "worker_wall_time": "worker_clock",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_getattr(__name__, _EXPORTS)
