"""The live views of a running test: the LLM tabs in Locust's web UI, the master's Prometheus
endpoint and the one-line progress display.

They read what the runtime hands them and never import it (a test checks the direction), so a
view cannot change what a run measures."""

from __future__ import annotations

from loadgen.lazy_exports import lazy_getattr

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

__getattr__ = lazy_getattr(__name__, _EXPORTS)
