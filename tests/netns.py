"""Hosts in Linux network namespaces, joined by a bridge, for tests that need separate machines.

A ``Topology`` makes one namespace per host and one for the bridge. Each host has one veth link
to the bridge (``eth0``, with an address in 10.77.0.0/24), its own loopback, and its own UTS
namespace per process with the host's name as hostname, so a Locust worker's client id names its
host. Nothing is created in the root namespace: each veth pair is made inside the bridge
namespace with its other end moved straight into the host's, so deleting the namespaces removes
every link. The addresses exist only inside these namespaces, and no namespace has a default
route: no packet can leave for a real network.

Names carry this process's id (``lgmh-<pid>-<host>``): two test runs never collide, and
``remove_stale()`` deletes what a killed run left (namespaces whose pid is gone, with any process
still inside them). Processes start in their own session (``start``), so ``destroy()`` can kill
each one with its children; whatever is still inside a namespace is killed before it is deleted.

    with Topology({"m": 2, "w1": 11}) as topo:
        proc = topo.start("m", [sys.executable, "-m", "loadgen", ...], log_path)
        topo.partition("m", "w1")   # blackhole routes both ways: the link is cut, TCP waits
        topo.heal("m", "w1")
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

NAME_PREFIX = "lgmh"
SUBNET = "10.77.0"  # /24; exists only inside the namespaces
IP_TIMEOUT_S = 10.0


class NetnsError(RuntimeError):
    """An ``ip`` command failed; the message names it and carries its stderr."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT_S)
    if check and r.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {r.stderr.strip() or f'exit {r.returncode}'}")
    return r


def unavailable_reason() -> str | None:
    """Why namespaces with veth links and a bridge cannot be made here; None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root (run as root, as CI does)"
    for tool in ("ip", "unshare", "hostname"):
        if shutil.which(tool) is None:
            return f"no '{tool}' command (install iproute2 / util-linux)"
    probe = f"{NAME_PREFIX}-{os.getpid()}-probe"
    try:
        _ip("netns", "add", probe)
        try:
            _ip("-n", probe, "link", "add", "br0", "type", "bridge")
            _ip("-n", probe, "link", "add", "va", "type", "veth", "peer", "name", "vb")
        finally:
            _ip("netns", "del", probe, check=False)
    except (NetnsError, OSError, subprocess.TimeoutExpired) as e:
        return f"cannot create a network namespace with a bridge and veth links: {e}"
    return None


def _namespaces() -> list[str]:
    r = _ip("netns", "list", check=False)
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


def _pids_in(netns: str) -> list[int]:
    r = _ip("netns", "pids", netns, check=False)
    return [int(p) for p in r.stdout.split() if p.isdigit()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _delete(netns: str, timeout_s: float = 10.0) -> None:
    """Kill every process inside ``netns``, then delete it (its links go with it)."""
    end = time.monotonic() + timeout_s
    while (pids := _pids_in(netns)) and time.monotonic() < end:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    _ip("netns", "del", netns, check=False)


def remove_stale() -> list[str]:
    """Delete the namespaces of test runs that are gone (killed before they cleaned up)."""
    removed = []
    for name in _namespaces():
        parts = name.split("-")
        if len(parts) >= 3 and parts[0] == NAME_PREFIX and parts[1].isdigit() and not _alive(int(parts[1])):
            _delete(name)
            removed.append(name)
    return removed


@dataclass(frozen=True)
class Host:
    name: str  # also its hostname
    netns: str
    address: str


class Topology:
    """Hosts (name -> last octet of its address) on one bridge; ``destroy()`` removes it all."""

    def __init__(self, hosts: dict[str, int]) -> None:
        tag = f"{NAME_PREFIX}-{os.getpid()}"
        self.bridge_netns = f"{tag}-bridge"
        self.hosts = {name: Host(name, f"{tag}-{name}", f"{SUBNET}.{octet}") for name, octet in hosts.items()}
        self._procs: list[subprocess.Popen] = []
        self._made: list[str] = []

    def __enter__(self) -> Topology:
        try:
            self.create()
        except BaseException:
            self.destroy()
            raise
        return self

    def __exit__(self, *_exc: object) -> None:
        self.destroy()

    def address(self, name: str) -> str:
        return self.hosts[name].address

    def create(self) -> None:
        br = self.bridge_netns
        _ip("netns", "add", br)
        self._made.append(br)
        _ip("-n", br, "link", "add", "br0", "type", "bridge")
        _ip("-n", br, "link", "set", "br0", "up")
        for host in self.hosts.values():
            _ip("netns", "add", host.netns)
            self._made.append(host.netns)
            _ip("-n", host.netns, "link", "set", "lo", "up")
            port = f"p-{host.name}"
            _ip("-n", br, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", host.netns)
            _ip("-n", br, "link", "set", port, "master", "br0", "up")
            _ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
            _ip("-n", host.netns, "link", "set", "eth0", "up")

    def start(self, name: str, argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
        """Run ``argv`` on host ``name`` (its namespace, hostname ``name``), output to ``log``.

        ``env`` is the whole environment (default: this process's); the process leads its own
        session, so ``destroy()`` kills it with its children."""
        host = self.hosts[name]
        cmd = ["ip", "netns", "exec", host.netns, "unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', name, *argv]
        with log.open("ab") as out:
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=env if env is not None else dict(os.environ),
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        self._procs.append(proc)
        return proc

    def partition(self, a: str, b: str) -> None:
        """Cut the path between hosts ``a`` and ``b`` both ways (blackhole routes): their packets
        are dropped, so TCP between them retransmits until ``heal``; other paths stay up."""
        _ip("-n", self.hosts[a].netns, "route", "add", "blackhole", f"{self.address(b)}/32")
        _ip("-n", self.hosts[b].netns, "route", "add", "blackhole", f"{self.address(a)}/32")

    def heal(self, a: str, b: str) -> None:
        _ip("-n", self.hosts[a].netns, "route", "del", "blackhole", f"{self.address(b)}/32", check=False)
        _ip("-n", self.hosts[b].netns, "route", "del", "blackhole", f"{self.address(a)}/32", check=False)

    @staticmethod
    def kill(proc: subprocess.Popen) -> None:
        """SIGKILL ``proc``'s whole process group (it leads its session) and reap it."""
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def destroy(self) -> None:
        """Kill every process started here and anything else inside the namespaces; delete them."""
        for proc in self._procs:
            self.kill(proc)
        for netns in reversed(self._made):
            _delete(netns)
        self._made.clear()
