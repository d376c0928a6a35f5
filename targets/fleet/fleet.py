"""A local fleet: N engine replicas on 127.0.0.1 behind one real router, owned and torn down.

    with start_fleet(replicas=2, profile="tiny", time_scale=0.1, seed=7,
                     router="sglang:round_robin") as fleet:
        fleet.url              # the router: send traffic here
        fleet.replica_urls     # each replica, for ground truth and /metrics
        fleet.router_identity  # name, version, policy, workers: record it with the run
        fleet.session_header   # send the session id in this header

Every replica and the router is a child process we own (see ``procs``): they are stopped on
``stop()`` or on leaving the ``with`` block, and killed by the kernel if this process dies.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import math
import os
import re
import signal
import sys
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from targets.fleet.coldstart import ColdStart, ColdStartWatch, collect_cold_starts
from targets.fleet.procs import (
    LOOPBACK,
    FleetError,
    OwnedProcess,
    child_env,
    ensure_port_free,
    http_get,
    port_holder_pid,
    process_title,
    spawn,
    stop_all,
    wait_for_log_line,
    wait_healthy,
)
from targets.fleet.routers import (
    Router,
    RouterIdentity,
    RouterSpec,
    installed_version,
    parse_router_spec,
    start_router,
)
from targets.sim.profile import ProfileError, is_profile_file, load_profile_file, profile_names

ENGINES = ("sim", "llama-server")
_SIM_LISTENING = re.compile(r"loadgen-sim listening on (http://127\.0\.0\.1:\d+)")
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the directory that holds ``targets/``


def replica_seed(fleet_seed: int, index: int) -> int:
    """The seed of replica ``index``: a fixed function of the fleet seed, distinct per replica
    and unrelated between neighbouring fleet seeds (0 <= seed < 2**31)."""
    digest = hashlib.sha256(f"loadgen-fleet:{fleet_seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


@dataclass
class Replica:
    """One engine replica: where it listens and which process it is."""

    name: str
    url: str
    server_id: str
    seed: int
    process: OwnedProcess = field(repr=False)
    info: dict = field(default_factory=dict, repr=False)  # what it said about itself


@dataclass
class Fleet:
    """Replicas and their router (None with ``router='none'`` and one replica)."""

    replicas: list[Replica]
    router: Router | None
    engine: str
    log_dir: Path

    @property
    def url(self) -> str:
        """Where to send traffic: the router, or the only replica when there is no router."""
        return self.router.url if self.router else self.replicas[0].url

    @property
    def replica_urls(self) -> list[str]:
        return [r.url for r in self.replicas]

    @property
    def router_identity(self) -> RouterIdentity | None:
        return self.router.identity if self.router else None

    @property
    def session_header(self) -> str | None:
        """The header the router hashes for session affinity (None without a router)."""
        return self.router.session_header if self.router else None

    def verify(self) -> None:
        """Fail unless the router on our port is still ours, with our replicas and policy."""
        if self.router:
            self.router.verify()

    def describe(self) -> dict:
        """The fleet as plain data, for a run's metadata."""
        return {
            "url": self.url,
            "engine": self.engine,
            "replicas": [{"url": r.url, "server_id": r.server_id, "seed": r.seed} for r in self.replicas],
            "router": self.router.identity.as_dict() if self.router else None,
            "log_dir": str(self.log_dir),
        }

    def summary_line(self) -> str:
        """One line for people: ``'sglang-router 0.3.2 (policy cache_aware, session header
        X-SMG-Routing-Key, affinity prefix) in front of 2 sim replicas'``."""
        n = len(self.replicas)
        where = f"{n} {self.engine} replica{'s' if n != 1 else ''}"
        ident = self.router_identity
        if ident is None:
            return f"{where}, no router"
        return (
            f"{ident.name} {ident.version} (policy {ident.policy}, session header {ident.session_header}, "
            f"affinity {ident.affinity}) in front of {where}"
        )

    def processes(self) -> list[OwnedProcess]:
        return ([self.router.process] if self.router else []) + [r.process for r in self.replicas]

    def cold_starts(self, timeout_s: float = 30.0) -> list[ColdStart]:
        """How each process started (router first), waiting up to ``timeout_s`` for the last
        first-token probes (see ``coldstart``); a process without a watch is left out."""
        return collect_cold_starts(self.processes(), timeout_s)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the router and every replica (SIGTERM, then SIGKILL after ``timeout_s``)."""
        stop_all(self.processes(), timeout_s)

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _sim_argv(profile: str, time_scale: float, seed: int, server_id: str) -> list[str]:
    return [
        sys.executable, "-m", "targets.sim",
        "--host", LOOPBACK, "--port", "0",
        "--profile", profile, "--time-scale", repr(time_scale),
        "--seed", str(seed), "--server-id", server_id,
    ]  # fmt: skip


def _check_sim_identity(replica: Replica) -> None:
    """The sim on the URL must be the process we started, with the server id we gave it."""
    try:
        status, body = http_get(f"{replica.url}/sim/info")
    except OSError as e:
        raise FleetError(f"{replica.name} at {replica.url} does not answer GET /sim/info ({e})") from None
    if status != 200:
        raise FleetError(f"{replica.name} at {replica.url} answers GET /sim/info with HTTP {status}")
    info = _json(body)
    if info.get("pid") != replica.process.pid or info.get("server_id") != replica.server_id:
        raise FleetError(
            f"{replica.url} is served by pid {info.get('pid')} (server id {info.get('server_id')!r}), "
            f"not by {replica.name} (pid {replica.process.pid}, server id {replica.server_id!r})"
        )
    replica.info = info


def _json(body: bytes) -> dict:
    try:
        value = json.loads(body)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def start_sim_replicas(
    n: int,
    *,
    profile: str,
    time_scale: float,
    seed: int,
    log_dir: Path,
    startup_timeout_s: float,
    sim_args: Sequence[str] = (),
) -> list[Replica]:
    """Start ``n`` simulated engines on free ports and wait until each is healthy and ours.

    ``sim_args`` are extra ``python -m targets.sim`` flags for every replica (e.g. ``--answers``).
    """
    env = child_env(
        {"PYTHONPATH": os.pathsep.join(filter(None, [str(_PACKAGE_ROOT), os.environ.get("PYTHONPATH")]))}
    )
    replicas = []
    try:
        for i in range(n):
            server_id = f"replica-{i}"
            rs = replica_seed(seed, i)
            argv = [*_sim_argv(profile, time_scale, rs, server_id), *sim_args]
            proc = spawn(f"sim-{i}", argv, log_dir=log_dir, env=env)
            proc.cold_start = ColdStartWatch(
                proc, role="replica", port_pattern=_SIM_LISTENING, timeout_s=startup_timeout_s
            )
            replicas.append(Replica(name=f"sim-{i}", url="", server_id=server_id, seed=rs, process=proc))
        for r in replicas:
            r.url = wait_for_log_line(r.process, _SIM_LISTENING, startup_timeout_s).group(1)
            wait_healthy(r.process, f"{r.url}/health", startup_timeout_s)
            _check_sim_identity(r)
    except BaseException:
        stop_all([r.process for r in replicas])
        raise
    return replicas


def start_llama_replicas(
    n: int, *, seed: int, log_dir: Path, startup_timeout_s: float, parallel: int = 1, ctx: int = 2048
) -> list[Replica]:
    """Start ``n`` llama-server replicas with targets.llamacpp's launcher and take them over.

    The binary and model come from its cache (``scripts/llama-server.sh ensure``); nothing is
    built or downloaded here. Every replica samples with the seed ``replica_seed(seed, 0)``
    (the launcher passes one set of flags to all of them).
    """
    try:
        launcher = importlib.import_module("targets.llamacpp.launcher")
    except ModuleNotFoundError:
        raise FleetError(
            "--engine llama-server needs targets.llamacpp, which this installation lacks"
        ) from None
    binary, model = launcher.ensure_llama_server(build=False)
    shared_seed = replica_seed(seed, 0)
    servers = launcher.start_llama_servers(
        n, binary=binary, model_path=model, log_dir=log_dir, ready_timeout=startup_timeout_s,
        parallel=parallel, ctx=ctx, extra_args=["--seed", str(shared_seed)],
    )  # fmt: skip
    # Their Popen handles become OwnedProcesses: the fleet stops and watches them like the rest.
    replicas = [
        Replica(
            name=f"llama-server-{s.index}",
            url=s.url,
            server_id=f"replica-{s.index}",
            seed=shared_seed,
            process=OwnedProcess(
                name=f"llama-server-{s.index}",
                argv=s.argv,
                log_path=s.log_path,
                popen=s.process,
                launched_at=s.owned.launched_at,
                cold_start=s.owned.cold_start,
            ),
        )
        for s in servers
    ]
    try:
        for r in replicas:
            _check_port_holder(r)
    except FleetError:
        stop_all([r.process for r in replicas])
        raise
    return replicas


def _check_port_holder(replica: Replica) -> None:
    """The process listening on the replica's port must be the one we started."""
    holder = port_holder_pid(int(replica.url.rsplit(":", 1)[1]))
    if holder is not None and holder != replica.process.pid:
        raise FleetError(
            f"{replica.url} is served by pid {holder} ({process_title(holder)}), "
            f"not by {replica.name} (pid {replica.process.pid})"
        )


def start_fleet(
    replicas: int = 1,
    engine: str = "sim",
    profile: str = "tiny",
    time_scale: float = 1.0,
    seed: int = 0,
    router: str | RouterSpec | None = "sglang:cache_aware",
    *,
    router_port: int | None = None,
    router_args: Sequence[str] = (),
    log_dir: Path | None = None,
    startup_timeout_s: float = 60.0,
    sim_args: Sequence[str] = (),
    llama_parallel: int = 1,
    llama_ctx: int = 2048,
) -> Fleet:
    """Start ``replicas`` engines and, in front of them, the router ``router`` names.

    ``router`` is a spec such as ``'sglang:cache_aware'``, ``'vllm:consistent_hash'`` or
    ``'none'`` (only with one replica). Replica ``i`` gets seed ``replica_seed(seed, i)`` and
    server id ``replica-i``. Logs go to ``log_dir`` (a new temporary directory by default) and
    stay there after ``stop()``. Input is checked before anything starts; any failure while
    starting stops what was started and raises ``FleetError`` (one line, with a log tail).
    ``profile`` is a shipped sim profile or a profile file (``.json``); ``llama_parallel`` and
    ``llama_ctx`` are llama-server's ``--parallel`` (slots) and ``--ctx-size`` (KV tokens of a
    replica, shared by its slots). ``sim_args`` are extra flags for every sim replica. Each
    process gets a cold-start watch (``Fleet.cold_starts()``).
    """
    if not isinstance(replicas, int) or replicas < 1:
        raise FleetError(f"--replicas must be a whole number >= 1 (got {replicas!r})")
    if engine not in ENGINES:
        raise FleetError(f"unknown engine {engine!r}; choose one of: {', '.join(ENGINES)}")
    if engine == "sim" and is_profile_file(profile):
        try:
            load_profile_file(profile)
        except ProfileError as e:
            raise FleetError(str(e)) from None
    elif engine == "sim" and profile not in (names := profile_names()):
        raise FleetError(f"unknown sim profile {profile!r}; choose one of: {', '.join(names)}")
    if not (isinstance(time_scale, int | float) and math.isfinite(time_scale) and time_scale >= 0):
        raise FleetError(
            f"--time-scale must be a number >= 0 (got {time_scale!r}); 0.1 runs ten times faster, 0 flat out"
        )
    spec = parse_router_spec(router) if isinstance(router, str) else router
    if spec is None and replicas > 1:
        raise FleetError(
            f"--replicas {replicas} needs a router to share one URL; use e.g. --router sglang:round_robin"
        )
    if spec is not None:
        installed_version(spec.kind)
        if router_port is not None:
            ensure_port_free(router_port, f"{spec.kind.name} port")
    log_dir = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix="loadgen-fleet-"))

    if engine == "sim":
        started = start_sim_replicas(
            replicas, profile=profile, time_scale=time_scale, seed=seed, log_dir=log_dir,
            startup_timeout_s=startup_timeout_s, sim_args=sim_args,
        )  # fmt: skip
    else:
        started = start_llama_replicas(
            replicas, seed=seed, log_dir=log_dir, startup_timeout_s=startup_timeout_s,
            parallel=llama_parallel, ctx=llama_ctx,
        )
    fleet = Fleet(replicas=started, router=None, engine=engine, log_dir=log_dir)
    if spec is None:
        return fleet
    try:
        fleet.router = start_router(
            spec, fleet.replica_urls, log_dir=log_dir, port=router_port,
            startup_timeout_s=startup_timeout_s, extra_args=router_args,
        )  # fmt: skip
    except BaseException:
        fleet.stop()
        raise
    return fleet


def serve_fleet(*, echo=print, note=None, poll_s: float = 0.5, **fleet_args) -> int:
    """Start a fleet, announce it, and keep it up until SIGINT or SIGTERM; then tear it down.

    ``echo`` gets one URL per line, the router's first (the only replica's without a router),
    then each replica's; ``note`` (default: stderr) gets a one-line summary. Returns the exit
    code: 0 after a signal, 1 if a fleet process died while serving (its log tail is shown).
    """
    note = note or (lambda line: print(line, file=sys.stderr, flush=True))
    stop_requested = threading.Event()

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt  # while starting: start_fleet stops what it started

    previous = {s: signal.signal(s, interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            fleet = start_fleet(**fleet_args)
        except KeyboardInterrupt:
            return 0
        for s in previous:
            signal.signal(s, lambda *_: stop_requested.set())
        try:
            for url in dict.fromkeys([fleet.url, *fleet.replica_urls]):
                echo(url)
            note(f"fleet ready: {fleet.summary_line()}; logs in {fleet.log_dir}; Ctrl-C stops it")
            while not stop_requested.wait(poll_s):
                dead = next((p for p in fleet.processes() if not p.alive()), None)
                if dead is not None:
                    note(f"Error: {dead.describe_exit()}")
                    return 1
            return 0
        finally:
            fleet.stop()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
