"""The simulated inference engine: a deterministic engine model behind an OpenAI-compatible server.

Imports nothing from ``loadgen``. ``python -m targets.sim --profile NAME`` starts one; see
docs/sim.md.
"""

from targets.sim.engine import Arrival, Engine, QueueFull, RequestTooLong, SimSequence, Step, simulate
from targets.sim.faults import FaultConfig
from targets.sim.profile import Profile, ProfileError, load_profile, profile_names
from targets.sim.server import SimConfig, SimServer
from targets.sim.truth import TruthRecord

__all__ = [
    "Arrival",
    "Engine",
    "FaultConfig",
    "Profile",
    "ProfileError",
    "QueueFull",
    "RequestTooLong",
    "SimConfig",
    "SimSequence",
    "SimServer",
    "Step",
    "TruthRecord",
    "load_profile",
    "profile_names",
    "simulate",
]
