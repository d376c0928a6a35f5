"""What traffic looks like: workload specs, synthetic sessions, session files and arrival schedules.

Pure Python and numpy: nothing here imports Locust or opens a socket. docs/workloads.md is the guide.
"""

from workloads.arrivals import ARRIVAL_KINDS, constant, gamma, poisson, schedule, trace, worker_share
from workloads.dag import SessionPlan, plan_session
from workloads.distributions import Distribution, parse_distribution
from workloads.errors import WorkloadError
from workloads.loader import load_workload, shipped_workloads
from workloads.model import STEP_KINDS, TURN_CLASS_FIRST, TURN_CLASS_FOLLOW_UP, Session, Turn, turn_class
from workloads.sessions_jsonl import SessionFileWorkload, load_sessions_jsonl, write_sessions_jsonl
from workloads.spec import WorkloadSpec, load_spec, parse_spec
from workloads.synthetic import SyntheticWorkload
from workloads.workload import Workload

__all__ = [
    "ARRIVAL_KINDS",
    "STEP_KINDS",
    "TURN_CLASS_FIRST",
    "TURN_CLASS_FOLLOW_UP",
    "Distribution",
    "Session",
    "SessionFileWorkload",
    "SessionPlan",
    "SyntheticWorkload",
    "Turn",
    "Workload",
    "WorkloadError",
    "WorkloadSpec",
    "constant",
    "gamma",
    "load_sessions_jsonl",
    "load_spec",
    "load_workload",
    "parse_distribution",
    "parse_spec",
    "plan_session",
    "poisson",
    "schedule",
    "shipped_workloads",
    "trace",
    "turn_class",
    "worker_share",
    "write_sessions_jsonl",
]
