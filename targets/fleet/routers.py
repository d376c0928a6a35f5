"""Real routers in front of the fleet: SGLang's ``sglang-router`` and vLLM's ``vllm-router``.

A router spec names the router and its policy: ``sglang:cache_aware``, ``vllm:consistent_hash``,
or ``none``. ``start_router`` launches the router bound to 127.0.0.1 (sglang-router binds
0.0.0.0 by default) with its Prometheus exporter on 127.0.0.1 and a port of its own (both
routers default to 29000, so a second router would die with 'Address already in use'), waits
until it lists exactly our workers as healthy, and checks that the process answering on the
port is the one we started. docs/routers.md explains the policies and affinity headers.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import math
import re
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from targets.fleet.coldstart import ColdStartWatch
from targets.fleet.procs import (
    LOOPBACK,
    FleetError,
    OwnedProcess,
    child_env,
    ensure_port_free,
    free_port,
    http_get,
    port_holder_pid,
    process_title,
    spawn,
    wait_healthy,
)

INSTALL_HINT = "pip install 'loadgen[routers]'"


@dataclass(frozen=True)
class RouterKind:
    """What we know about one router program (checked against its ``--help``)."""

    key: str  # spec prefix: "sglang"
    name: str  # distribution and console script: "sglang-router"
    module: str  # run as ``python -m <module>``
    policies: tuple[str, ...]
    # The header the router hashes for session affinity, and the policies that use it.
    session_header: str
    header_policies: frozenset[str]
    # Policies that follow the request text's prefix (an approximate radix tree per worker).
    prefix_policies: frozenset[str]
    # Prometheus counter whose ``policy`` label shows the policy once a request was routed.
    policy_metric: str

    def affinity(self, policy: str) -> str:
        """How a session's turns stick to one replica: 'header', 'prefix' or 'none'."""
        if policy in self.header_policies:
            return "header"
        return "prefix" if policy in self.prefix_policies else "none"


# sglang-router 0.3.2 also has 'bucket' (prefill/decode only); vllm-router 0.1.17 also has
# 'kv_aware', which needs engine KV events over ZMQ that simulated replicas do not publish.
# vllm-router 0.1.17's cache_aware matches token ids, and it does not tokenize for HTTP workers:
# every decision is counted as outcome="missing_tokens" and falls back to the least-loaded
# worker, so it keeps no session on its replica (docs/routers.md).
SGLANG = RouterKind(
    key="sglang",
    name="sglang-router",
    module="sglang_router.launch_router",
    policies=("cache_aware", "manual", "power_of_two", "random", "round_robin"),
    session_header="X-SMG-Routing-Key",
    header_policies=frozenset({"manual"}),
    prefix_policies=frozenset({"cache_aware"}),
    policy_metric="smg_worker_selection_total",
)
VLLM = RouterKind(
    key="vllm",
    name="vllm-router",
    module="vllm_router.launch_router",
    policies=(
        "cache_aware",
        "consistent_hash",
        "power_of_two",
        "random",
        "round_robin",
        "sticky_least_loaded",
    ),
    session_header="X-Session-ID",
    header_policies=frozenset({"consistent_hash", "sticky_least_loaded"}),
    prefix_policies=frozenset(),
    policy_metric="vllm_router_policy_decisions_total",
)
ROUTER_KINDS: dict[str, RouterKind] = {k.key: k for k in (SGLANG, VLLM)}


class RouterSpecError(FleetError):
    """An unknown router or policy in a router spec (a ``ValueError``; the CLI exits 2)."""


@dataclass(frozen=True)
class RouterSpec:
    kind: RouterKind
    policy: str

    def __str__(self) -> str:
        return f"{self.kind.key}:{self.policy}"


def router_spec_choices() -> str:
    return ", ".join([*(f"{k}:<policy>" for k in ROUTER_KINDS), "none"])


def parse_router_spec(text: str) -> RouterSpec | None:
    """Parse ``'sglang:cache_aware'``, ``'vllm:round_robin'``, ``'sglang'`` (its default policy,
    cache_aware) or ``'none'`` (returns None). Anything else raises ``RouterSpecError``
    listing the choices."""
    text = text.strip()
    if text.lower() == "none":
        return None
    key, _, policy = text.partition(":")
    kind = ROUTER_KINDS.get(key.strip().lower())
    if kind is None:
        raise RouterSpecError(f"unknown router {key!r} in {text!r}; choose one of: {router_spec_choices()}")
    policy = policy.strip().lower() or "cache_aware"
    if policy not in kind.policies:
        raise RouterSpecError(
            f"unknown policy {policy!r} for {kind.name}; choose one of: {', '.join(kind.policies)}"
        )
    return RouterSpec(kind, policy)


def installed_version(kind: RouterKind) -> str:
    """The installed version of the router's package, or ``FleetError`` with the install command."""
    if importlib.util.find_spec(kind.module.split(".")[0]) is None:
        raise FleetError(f"{kind.name} is not installed; run: {INSTALL_HINT}")
    try:
        return importlib.metadata.version(kind.name)
    except importlib.metadata.PackageNotFoundError:
        raise FleetError(f"{kind.name} is not installed; run: {INSTALL_HINT}") from None


@dataclass(frozen=True)
class RouterIdentity:
    """Who answers on the router URL: recorded with every run that goes through it."""

    name: str  # "sglang-router"
    version: str
    policy: str
    worker_urls: tuple[str, ...]
    url: str
    pid: int
    prometheus_url: str
    session_header: str
    affinity: str  # "header", "prefix" or "none" (see RouterKind.affinity)

    def as_dict(self) -> dict:
        return asdict(self)


def router_argv(
    spec: RouterSpec,
    worker_urls: Sequence[str],
    *,
    port: int,
    prometheus_port: int,
    startup_timeout_s: float,
    log_level: str = "warn",
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The command line for a router bound to 127.0.0.1 (both its ports)."""
    if spec.kind is VLLM and log_level == "warn":
        log_level = "warning"  # vllm-router spells it out
    return [
        sys.executable, "-m", spec.kind.module,
        "--host", LOOPBACK,
        "--port", str(port),
        "--worker-urls", *worker_urls,
        "--policy", spec.policy,
        "--prometheus-host", LOOPBACK,
        "--prometheus-port", str(prometheus_port),
        # The sim keys its per-request truth by X-Request-ID; the router must forward it.
        "--request-id-headers", "x-request-id",
        "--worker-startup-timeout-secs", str(max(1, math.ceil(startup_timeout_s))),
        "--worker-startup-check-interval", "1",
        "--log-level", log_level,
        *extra_args,
    ]  # fmt: skip


def router_env() -> dict[str, str]:
    """Our environment plus a stop to downloads: sglang-router fetches a tokenizer from the
    Hugging Face hub for every model it sees (it never needs one over HTTP). Pointing the hub
    at a closed loopback port makes that fail at once instead of reaching the internet."""
    return child_env({"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "1"})


def _normalize(url: str) -> str:
    return url.rstrip("/")


def read_workers(url: str, timeout_s: float = 2.0) -> list[dict]:
    """The router's ``GET /workers`` list (both routers serve it): url, is_healthy, load, ..."""
    status, body = http_get(f"{url}/workers", timeout_s)
    if status != 200:
        raise OSError(f"GET {url}/workers: HTTP {status}")
    return list(json.loads(body).get("workers", []))


def observed_policy(metrics_text: str, kind: RouterKind) -> str | None:
    """The policy named by the router's own Prometheus counters; None before any request."""
    m = re.search(rf'^{kind.policy_metric}\{{[^}}]*policy="([^"]+)"', metrics_text, re.MULTILINE)
    return m.group(1) if m else None


def check_identity(expected: RouterIdentity, kind: RouterKind) -> None:
    """Refuse to use ``expected.url`` unless the router there is the one ``expected`` describes.

    Checks, in order: the pid holding the port (when /proc shows it), the worker list (same
    URLs, all healthy), and the policy its metrics report (once it has routed a request). A
    router left from an earlier run, or started with another policy or other workers, fails
    with one line saying what differs.
    """
    port = int(expected.url.rsplit(":", 1)[1])
    where = f"router at {expected.url}"
    fix = f"stop the process on port {port} or choose another port"
    holder = port_holder_pid(port)
    if holder is not None and holder != expected.pid:
        raise FleetError(
            f"{where} is served by pid {holder} ({process_title(holder)}), not by the "
            f"{expected.name} we started (pid {expected.pid}); {fix}"
        )
    try:
        workers = read_workers(expected.url)
    except (OSError, ValueError) as e:
        raise FleetError(f"{where} does not answer GET /workers ({e}); {fix}") from None
    got = sorted(_normalize(w.get("url", "")) for w in workers)
    want = sorted(_normalize(u) for u in expected.worker_urls)
    if got != want:
        raise FleetError(f"{where} routes to {got or 'no workers'}, expected {want}; {fix}")
    unhealthy = [w["url"] for w in workers if not w.get("is_healthy", True)]
    if unhealthy:
        raise FleetError(f"{where} reports unhealthy workers {unhealthy}")
    try:
        status, body = http_get(f"{expected.prometheus_url}/metrics")
        policy = observed_policy(body.decode("utf-8", "replace"), kind) if status == 200 else None
    except OSError:
        policy = None
    if policy is not None and policy != expected.policy:
        raise FleetError(f"{where} routes with policy {policy!r}, expected {expected.policy!r}; {fix}")


@dataclass
class Router:
    """A router process we own, with its identity. Stop it with ``stop()``."""

    spec: RouterSpec
    identity: RouterIdentity
    process: OwnedProcess

    @property
    def url(self) -> str:
        return self.identity.url

    @property
    def session_header(self) -> str:
        """The header this router hashes for session affinity (``X-SMG-Routing-Key`` for
        sglang-router, ``X-Session-ID`` for vllm-router). Only ``identity.affinity == 'header'``
        policies route by it; sending it under other policies is harmless."""
        return self.identity.session_header

    def verify(self) -> None:
        """Fail unless the router on our port is still ours, with our workers and policy."""
        if not self.process.alive():
            raise FleetError(self.process.describe_exit())
        check_identity(self.identity, self.spec.kind)

    def stop(self, timeout_s: float = 5.0) -> None:
        self.process.stop(timeout_s)


def _workers_ready(expected: Sequence[str]):
    want = sorted(_normalize(u) for u in expected)

    def ready(status: int, body: bytes) -> bool:
        if status != 200:
            return False
        try:
            workers = json.loads(body).get("workers", [])
        except ValueError:
            return False
        got = sorted(_normalize(w.get("url", "")) for w in workers)
        return got == want and all(w.get("is_healthy", True) for w in workers)

    return ready


def start_router(
    spec: RouterSpec | str,
    worker_urls: Sequence[str],
    *,
    log_dir: Path,
    port: int | None = None,
    prometheus_port: int | None = None,
    startup_timeout_s: float = 30.0,
    log_level: str = "warn",
    extra_args: Sequence[str] = (),
) -> Router:
    """Start a router in front of ``worker_urls`` and return it once it routes to all of them.

    ``port``/``prometheus_port`` default to free ports; a given port that another process
    holds is refused (``FleetError`` naming the holder). ``extra_args`` pass through to the
    router (e.g. ``['--disable-retries']``). A router that exits, or that does not list every
    worker as healthy within ``startup_timeout_s``, raises ``FleetError`` with its log tail.
    """
    if isinstance(spec, str):
        parsed = parse_router_spec(spec)
        if parsed is None:
            raise RouterSpecError("start_router needs a router, not 'none'")
        spec = parsed
    kind = spec.kind
    version = installed_version(kind)
    if not worker_urls:
        raise FleetError(f"{kind.name} needs at least one worker URL")
    for given, what in ((port, f"{kind.name} port"), (prometheus_port, f"{kind.name} prometheus port")):
        if given is not None:
            ensure_port_free(given, what)
    # Ports we pick can be taken by someone else before the router binds them: retry then.
    attempts = 1 if (port is not None and prometheus_port is not None) else 3
    for attempt in range(attempts):
        p = port if port is not None else free_port()
        pp = prometheus_port if prometheus_port is not None else free_port()
        while pp == p:
            pp = free_port()
        argv = router_argv(
            spec, worker_urls, port=p, prometheus_port=pp, startup_timeout_s=startup_timeout_s,
            log_level=log_level, extra_args=extra_args,
        )  # fmt: skip
        proc = spawn(f"{kind.name}-{p}", argv, log_dir=log_dir, env=router_env())
        proc.cold_start = ColdStartWatch(
            proc, role="router", name=kind.name, port=p, health_path="/workers",
            ready=_workers_ready(worker_urls), timeout_s=startup_timeout_s,
        )  # fmt: skip
        url = f"http://{LOOPBACK}:{p}"
        try:
            wait_healthy(proc, f"{url}/workers", startup_timeout_s, ready=_workers_ready(worker_urls))
        except FleetError:
            proc.stop()
            if attempt + 1 < attempts and "Address already in use" in proc.tail(40):
                continue
            raise
        identity = RouterIdentity(
            name=kind.name,
            version=version,
            policy=spec.policy,
            worker_urls=tuple(_normalize(u) for u in worker_urls),
            url=url,
            pid=proc.pid,
            prometheus_url=f"http://{LOOPBACK}:{pp}",
            session_header=kind.session_header,
            affinity=kind.affinity(spec.policy),
        )
        router = Router(spec=spec, identity=identity, process=proc)
        try:
            router.verify()
        except FleetError:
            router.stop()
            raise
        return router
    raise AssertionError("unreachable")  # the loop returns or raises
