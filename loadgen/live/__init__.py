"""The live views of a running test: the LLM tabs in Locust's web UI, the master's Prometheus
endpoint and the one-line progress display.

They read what the runtime hands them and never import it (a test checks the direction), so a
view cannot change what a run measures."""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "Family": "exposition",
    "LiveView": "webui",
    "MetricsEndpoint": "metrics_endpoint",
    "ProgressLine": "progress",
    "RunSnapshot": "snapshot",
    "check_bindable": "metrics_endpoint",
    "collect": "prometheus",
    "install_endpoint": "metrics_endpoint",
    "install_web_ui": "webui",
    "render": "exposition",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    # Loaded on first use, so importing one module of this package does not import them all.
    if name in _EXPORTS:
        return getattr(import_module(f"loadgen.live.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
