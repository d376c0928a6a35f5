"""Start and stop local llama.cpp ``llama-server`` replicas that die with their parent.

The binary and the model come from the cache that ``scripts/llama-server.sh ensure`` fills
(see docs/llama-server.md); :func:`ensure_llama_server` finds them. Each replica is an owned child
process (``targets.fleet.procs``: its own process group, ``PR_SET_PDEATHSIG``, one log file) on a
free 127.0.0.1 port, and is ready only once ``GET /health`` answers 200.

    binary, model = ensure_llama_server()
    with start_llama_servers(2, binary=binary, model_path=model, parallel=2, ctx=4096) as fleet:
        urls = fleet.urls
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from targets.fleet.coldstart import ColdStartWatch
from targets.fleet.procs import (
    FleetError,
    OwnedProcess,
    child_env,
    ensure_port_free,
    free_port,
    http_get,
    port_holder_pid,
    process_title,
    spawn,
    stop_all,
    wait_healthy,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "scripts" / "llama-server.sh"

BIND_ATTEMPTS = 3
# What llama-server logs when its port was taken between our probe and its own bind.
_BIND_ERRORS = ("couldn't bind", "address already in use", "failed to bind")


class LlamaServerError(FleetError):
    """llama-server or its model cannot be found or used; ``str()`` is the one-line message."""


def ensure_llama_server(*, build: bool = False, timeout_s: float = 3600.0) -> tuple[Path, Path]:
    """Return ``(binary, model)`` from the cache (or ``LLAMA_SERVER_BIN`` / ``LLAMA_SERVER_MODEL``).

    With ``build=False`` (the default) nothing is compiled or downloaded: a missing binary or model
    raises a one-line :class:`LlamaServerError` naming the command to run. ``build=True`` runs
    ``scripts/llama-server.sh ensure``, which takes minutes the first time on a machine.
    """
    env_bin, env_model = os.environ.get("LLAMA_SERVER_BIN"), os.environ.get("LLAMA_SERVER_MODEL")
    if not SCRIPT.is_file():
        if env_bin and env_model:
            return _checked(Path(env_bin), Path(env_model))
        raise LlamaServerError(
            f"{SCRIPT} not found (not a source checkout); set LLAMA_SERVER_BIN and LLAMA_SERVER_MODEL"
        )
    command = "ensure" if build else "paths"
    try:
        proc = subprocess.run(
            ["bash", str(SCRIPT), command], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        raise LlamaServerError(f"{SCRIPT} {command} took longer than {timeout_s:g}s") from None
    lines = proc.stdout.splitlines()
    if proc.returncode == 3:
        raise LlamaServerError(f"llama-server or its model is not in the cache yet; run: {SCRIPT} ensure")
    if proc.returncode != 0 or len(lines) < 2:
        last = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        raise LlamaServerError(f"{SCRIPT} {command} failed: {last}")
    return _checked(Path(lines[0]), Path(lines[1]))


def _checked(binary: Path, model: Path) -> tuple[Path, Path]:
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        raise LlamaServerError(f"llama-server binary {binary} is missing or not executable")
    if not model.is_file():
        raise LlamaServerError(f"model {model} is missing")
    return binary, model


def default_threads(n: int) -> int:
    """CPU threads per replica when ``n`` replicas share this machine: cores // n, at least 1."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, cores // max(1, n))


def build_argv(
    binary: Path | str,
    model_path: Path | str,
    *,
    port: int,
    parallel: int,
    ctx: int,
    threads: int,
    host: str = "127.0.0.1",
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The llama-server command line for one replica (``ctx`` is the KV size shared by all slots)."""
    return [
        str(binary),
        "--model", str(model_path),
        "--host", host,
        "--port", str(port),
        "--parallel", str(parallel),
        "--ctx-size", str(ctx),
        "--threads", str(threads),
        "--metrics",
        "--slots",
        "--no-webui",
        # No extra CPU buffer types (weight repacking, AMX): a GGML_NATIVE build for a CPU that
        # advertises AMX runs tile instructions, which SIGILL where the VM does not enable AMX
        # state (Firecracker guests do not). SmolLM2's Q4_1 weights are not repacked anyway.
        "--no-repack",
        *extra_args,
    ]  # fmt: skip


@dataclass
class Replica:
    """One running llama-server child process."""

    index: int
    host: str
    port: int
    owned: OwnedProcess = field(repr=False)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def process(self) -> subprocess.Popen:
        return self.owned.popen

    @property
    def pid(self) -> int:
        return self.owned.pid

    @property
    def argv(self) -> list[str]:
        return self.owned.argv

    @property
    def log_path(self) -> Path:
        return self.owned.log_path

    def alive(self) -> bool:
        return self.owned.alive()

    def get_json(self, path: str, timeout_s: float = 5.0) -> Any:
        """``GET path`` (no proxy) and decode the JSON body; a non-200 answer raises ``FleetError``."""
        status, body = http_get(self.url + path, timeout_s)
        if status != 200:
            raise FleetError(f"GET {self.url}{path} answered HTTP {status}: {body[:120]!r}")
        return json.loads(body)

    def props(self, timeout_s: float = 5.0) -> dict[str, Any]:
        """``GET /props``: model path, slot count, build info (for identity checks)."""
        return self.get_json("/props", timeout_s)

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM the replica's process group, wait, then SIGKILL; reaps the child."""
        stop_all([self.owned], timeout_s)

    def __enter__(self) -> Replica:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Replicas(list[Replica]):
    """The replicas of one :func:`start_llama_servers` call: a list and a context manager.

    ``stop()`` also removes the temporary log directory the start created, if any (a failed start
    keeps it: its error message points at the log).
    """

    owned_log_dir: Path | None = None

    @property
    def urls(self) -> list[str]:
        return [r.url for r in self]

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop every replica under one shared deadline."""
        stop_all([r.owned for r in self], timeout_s)
        if self.owned_log_dir is not None:
            shutil.rmtree(self.owned_log_dir, ignore_errors=True)
            self.owned_log_dir = None

    def __enter__(self) -> Replicas:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_llama_servers(
    n: int,
    *,
    model_path: Path | str,
    binary: Path | str,
    parallel: int = 1,
    ctx: int = 2048,
    threads: int | None = None,
    host: str = "127.0.0.1",
    extra_args: Iterable[str] = (),
    alias: str | None = None,
    ready_timeout: float = 120.0,
    log_dir: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    port_base: int | None = None,
) -> Replicas:
    """Start ``n`` llama-server replicas on free ports and wait until each answers ``/health``.

    ``threads`` defaults to :func:`default_threads` (cores // n). ``alias`` sets the model id that
    ``/v1/models`` and responses report (llama-server's default is the model path). By default
    each replica gets a free port; with ``port_base``, replica ``i`` listens on ``port_base + i``,
    and a port already in use stops the start before anything runs (one line naming its holder).
    ``ready_timeout`` (seconds) bounds the whole start. Logs go to
    ``log_dir/llama-server-<i>.log``; without ``log_dir``, to a temporary directory that ``stop()``
    removes. On any failure the replicas already started are stopped and a one-line ``FleetError``
    names the failing replica and quotes the tail of its log, which is kept.
    """
    if n < 1:
        raise LlamaServerError(f"number of llama-server replicas must be >= 1, got {n}")
    if parallel < 1 or ctx < 1:
        raise LlamaServerError(f"llama-server needs parallel >= 1 and ctx >= 1, got {parallel} and {ctx}")
    binary, model_path = _checked(Path(binary), Path(model_path))
    threads = default_threads(n) if threads is None else threads
    if threads < 1:
        raise LlamaServerError(f"llama-server threads must be >= 1, got {threads}")
    if port_base is not None:
        if not 1 <= port_base <= 65536 - n:
            raise LlamaServerError(f"port base must leave room for {n} ports below 65536, got {port_base}")
        for i in range(n):
            ensure_port_free(port_base + i, f"llama-server-{i} port", host)
    replicas = Replicas()
    if log_dir is None:
        logs = replicas.owned_log_dir = Path(tempfile.mkdtemp(prefix="llama-server-"))
    else:
        logs = Path(log_dir)
    extra = ["--alias", alias, *extra_args] if alias else list(extra_args)
    # llama-server reads LLAMA_ARG_* variables as flags; a stray one in the caller's environment
    # would silently change what gets measured, so only the command line counts.
    environ = {k: v for k, v in child_env(env).items() if not k.startswith("LLAMA_ARG_")}

    def start(index: int) -> Replica:
        port = free_port(host) if port_base is None else port_base + index
        argv = build_argv(
            binary, model_path, port=port, parallel=parallel, ctx=ctx, threads=threads,
            host=host, extra_args=extra,
        )  # fmt: skip
        owned = spawn(f"llama-server-{index}", argv, log_dir=logs, env=environ)
        owned.cold_start = ColdStartWatch(owned, role="replica", port=port, timeout_s=ready_timeout)
        return Replica(index=index, host=host, port=port, owned=owned)

    deadline = time.monotonic() + ready_timeout
    try:
        replicas.extend(start(i) for i in range(n))
        for i in range(n):
            for attempt in range(1, BIND_ATTEMPTS + 1):
                try:
                    wait_healthy(replicas[i].owned, replicas[i].url + "/health", _left(deadline))
                    _check_port_holder(replicas[i])
                    break
                except FleetError:
                    if attempt == BIND_ATTEMPTS or port_base is not None or not _lost_port_race(replicas[i]):
                        raise
                    replicas[i].stop()
                    replicas[i] = start(i)
    except BaseException:
        replicas.owned_log_dir = None  # keep the logs the error message points at
        replicas.stop()
        raise
    return replicas


def _left(deadline: float) -> float:
    return max(0.1, deadline - time.monotonic())


def _check_port_holder(replica: Replica) -> None:
    """The process answering on the replica's port must be the one we started, not a stale one."""
    holder = port_holder_pid(replica.port)
    if holder is not None and holder != replica.pid:
        raise FleetError(
            f"{replica.url} is served by pid {holder} ({process_title(holder)}), not by "
            f"llama-server-{replica.index} (pid {replica.pid}); log tail ({replica.log_path}): "
            f"{replica.owned.tail()}"
        )


def _lost_port_race(replica: Replica) -> bool:
    """True when the replica exited because another process bound its port first."""
    if replica.alive():
        return False
    try:
        tail = replica.log_path.read_text("utf-8", "replace")[-4096:].lower()
    except OSError:
        return False
    return any(marker in tail for marker in _BIND_ERRORS)
