"""loadgen inside Locust: the plan each worker gets, the join secret, heartbeats and loss, the metric
exchange, the drain barrier, the results writer and the verdict.

This is the one package that imports Locust (with the locustfile and the commands that start it).
It drives the engine (``loadgen.engine``) on workers and feeds the live views (``loadgen.live``)
on the master. docs/architecture.md follows a run through it."""

from __future__ import annotations

from loadgen.lazy_exports import lazy_getattr

_EXPORTS = {
    "Accounting": "accounting",
    "FileFetch": "file_ship",
    "JoinGate": "join_gate",
    "LocalRuntime": "local",
    "MasterRuntime": "master",
    "MasterWatch": "master_watch",
    "PeerAddresses": "peer_address",
    "RUN_OPTIONS": "run_options",
    "ResultsWriter": "results_writer",
    "RunOption": "run_options",
    "RunOptions": "run_options",
    "Verdict": "verdict",
    "WorkerRuntime": "worker",
    "add_arguments": "locust_options",
    "config_from_options": "locust_options",
    "config_workload": "run_workload",
    "decide_verdict": "verdict",
    "install": "locust_runtime",
    "load_workload_named": "run_workload",
    "parse_loss_timeout": "loss_timeouts",
    "run_info": "run_record",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_getattr(__name__, _EXPORTS)
