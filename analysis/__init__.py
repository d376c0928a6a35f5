"""What the numbers mean: summaries, A/B comparison, the SLO gate, sweep search and reports.

``analysis`` reads a results directory (``run.json``, ``requests.jsonl``, ``metrics.hlog``; see
docs/results-format.md) and imports nothing of ours but itself. The names below are its public API;
they load on first use, so ``import analysis.records`` (which the runtime does on every worker)
stays cheap. ``analysis.hlog`` is the one writer and reader of ``metrics.hlog``. The gate is
``from analysis.gate import gate``: a package attribute named like a submodule would be replaced by
the module as soon as ``analysis.gate`` is imported.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "GateResult": "gate",
    "PercentileSlo": "slo",
    "RequestSlo": "slo",
    "ResultsError": "errors",
    "RunResults": "results",
    "SUMMARY_SCHEMA_VERSION": "summary",
    "Slos": "slo",
    "SweepPoint": "sweep",
    "SweepResult": "sweep",
    "compare_cdf_svg": "compare_format",
    "compare_runs": "compare",
    "compare_to_json": "compare_format",
    "compare_to_markdown": "compare_format",
    "evaluate_percentile_slos": "slo",
    "find_max_rate": "sweep",
    "format_compare": "compare_format",
    "format_summary": "summary_format",
    "format_sweep": "sweep",
    "grid": "sweep",
    "histograms_from_records": "results",
    "load_results": "results",
    "parse_slos": "slo",
    "read_requests": "results",
    "read_run_info": "results",
    "render_compare_report": "report",
    "render_report": "report",
    "render_sweep_report": "report",
    "summarize": "summary",
    "summary_to_csv": "summary_format",
    "write_report": "report",
    "write_summary": "summary",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'analysis' has no attribute {name!r}")
    value = getattr(import_module(f"analysis.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
