"""The local fleet: engine replicas behind a real router (sglang-router, vllm-router), owned.

See docs/routers.md for the routers, their policies and affinity headers.
"""

from targets.fleet.fleet import Fleet, Replica, replica_seed, serve_fleet, start_fleet, start_sim_replicas
from targets.fleet.procs import (
    FleetError,
    OwnedProcess,
    ensure_port_free,
    free_port,
    spawn,
    stop_all,
    wait_healthy,
)
from targets.fleet.routers import (
    ROUTER_KINDS,
    Router,
    RouterIdentity,
    RouterKind,
    RouterSpec,
    RouterSpecError,
    check_identity,
    parse_router_spec,
    start_router,
)

__all__ = [
    "ROUTER_KINDS",
    "Fleet",
    "FleetError",
    "OwnedProcess",
    "Replica",
    "Router",
    "RouterIdentity",
    "RouterKind",
    "RouterSpec",
    "RouterSpecError",
    "check_identity",
    "ensure_port_free",
    "free_port",
    "parse_router_spec",
    "replica_seed",
    "serve_fleet",
    "spawn",
    "start_fleet",
    "start_router",
    "start_sim_replicas",
    "stop_all",
    "wait_healthy",
]
