"""Cold start of what the fleet launches: launch -> port accepts -> healthy -> first token.

A ``ColdStartWatch`` is attached to a process right after it is spawned and times, from a
daemon thread and from the moment of launch (``OwnedProcess.launched_at``, monotonic clock):

* ``listening_s``: the port accepts a TCP connection (for the sim, whose port is chosen by the
  kernel, first the port is read from its "listening on" line);
* ``healthy_s``: the health endpoint answers as ready (engines: ``GET /health`` 200; routers:
  ``GET /workers`` lists every worker as healthy, the same test the fleet waits for);
* ``first_token_s``: the first streamed token of one short chat request (4 tokens), retried
  until one arrives: a router may refuse requests before it has seen its workers.

The watch polls every few milliseconds, independently of the fleet's own (slower) start-up
checks, so replicas started together are each timed on their own. Every wait has the watch's
deadline; a process that exits or misses the deadline leaves the remaining phases ``None`` and
says why in ``error``.
"""

from __future__ import annotations

import re
import socket
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from targets.adapters.base import ChatRequest
from targets.adapters.openai import OpenAIChatAdapter
from targets.fleet.procs import LOOPBACK, http_get
from targets.oneshot import send_one

if TYPE_CHECKING:
    from targets.fleet.procs import OwnedProcess

__all__ = ["PHASES", "ColdStart", "ColdStartWatch", "collect_cold_starts", "format_cold_starts", "measure_cold_starts"]

T = TypeVar("T")
PHASES = ("listening_s", "healthy_s", "first_token_s")
PHASE_TITLES = {"listening_s": "listening", "healthy_s": "healthy", "first_token_s": "first token"}
POLL_S = 0.005
PROBE_RETRY_S = 0.02
PROBE_MAX_TOKENS = 4


@dataclass(slots=True)
class ColdStart:
    """One process's start-up, in seconds since its launch (None: the phase was not reached)."""

    name: str
    role: str  # "replica" | "router"
    url: str | None = None
    listening_s: float | None = None
    healthy_s: float | None = None
    first_token_s: float | None = None
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None or k in PHASES}


class ColdStartWatch:
    """Times one launched process's start-up phases from a daemon thread (see the module doc).

    ``port`` is known in advance, or read from the process log with ``port_pattern`` (group 1
    is a URL ending in ``:PORT``). ``ready(status, body)`` decides when ``health_path`` is healthy.
    ``name`` (default: the process's) is how reports name it; keep it stable across launches.
    """

    def __init__(
        self,
        proc: OwnedProcess,
        *,
        role: str,
        port: int | None = None,
        port_pattern: re.Pattern[str] | None = None,
        health_path: str = "/health",
        ready: Callable[[int, bytes], bool] = lambda status, _body: status == 200,
        timeout_s: float = 120.0,
        name: str | None = None,
    ) -> None:
        if port is None and port_pattern is None:
            raise ValueError("a cold-start watch needs the port or a log pattern that names it")
        self.result = ColdStart(name or proc.name, role)
        self._proc = proc
        self._port = port
        self._port_pattern = port_pattern
        self._health_path = health_path
        self._ready = ready
        self._deadline = proc.launched_at + timeout_s
        self._done = threading.Event()
        threading.Thread(target=self._run, name=f"cold-start-{proc.name}", daemon=True).start()

    def wait(self, timeout_s: float) -> ColdStart:
        """The result once every phase is timed (or failed), waiting at most ``timeout_s``."""
        if not self._done.wait(timeout_s) and self.result.error is None:
            self.result.error = f"not through every phase within {timeout_s:g}s of asking"
        return self.result

    # --- the watch thread --------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._watch()
        except _Stop as e:
            self.result.error = str(e)
        except Exception as e:  # a bug here must not take the fleet down: record it
            self.result.error = f"{type(e).__name__}: {e}"
        finally:
            self._done.set()

    def _since_launch(self) -> float:
        return round(time.monotonic() - self._proc.launched_at, 4)

    def _tick(self, what: str) -> None:
        if not self._proc.alive():
            raise _Stop(f"exited before {what}")
        if time.monotonic() > self._deadline:
            raise _Stop(f"not {what} by the deadline")
        time.sleep(POLL_S)

    def _watch(self) -> None:
        port = self._port
        while port is None:
            port = self._port_from_log()
            if port is None:
                self._tick("listening")
        url = f"http://{LOOPBACK}:{port}"
        self.result.url = url
        while not _accepts(LOOPBACK, port):
            self._tick("listening")
        self.result.listening_s = self._since_launch()
        while True:
            try:
                status, body = http_get(url + self._health_path, timeout_s=1.0)
                if self._ready(status, body):
                    break
            except OSError:
                pass
            self._tick("healthy")
        self.result.healthy_s = self._since_launch()
        adapter = OpenAIChatAdapter(ignore_eos=True)
        while True:
            left = self._deadline - time.monotonic()
            req = ChatRequest(
                messages=[{"role": "user", "content": "Say hello."}],
                max_tokens=PROBE_MAX_TOKENS,
                session_id="loadgen-cold-start",
                request_id=f"loadgen-cold-start-{uuid.uuid4().hex[:12]}",
            )
            shot = send_one(url, adapter, req, timeout_s=max(0.1, min(30.0, left)))
            if shot.t_first is not None:
                self.result.first_token_s = round(shot.t_first - self._proc.launched_at, 4)
                return
            time.sleep(PROBE_RETRY_S)
            self._tick("streaming a token")

    def _port_from_log(self) -> int | None:
        try:
            text = self._proc.log_path.read_text("utf-8", "replace")
        except OSError:
            return None
        m = self._port_pattern.search(text) if self._port_pattern else None
        return int(m.group(1).rsplit(":", 1)[1]) if m else None


class _Stop(Exception):
    pass


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def collect_cold_starts(procs: Sequence[OwnedProcess], timeout_s: float = 30.0) -> list[ColdStart]:
    """The cold starts of ``procs`` that have a watch, waiting at most ``timeout_s`` in all."""
    deadline = time.monotonic() + timeout_s
    return [
        p.cold_start.wait(max(0.0, deadline - time.monotonic())) for p in procs if p.cold_start is not None
    ]


def measure_cold_starts(
    start: Callable[[], T],
    processes: Callable[[T], Sequence[OwnedProcess]],
    stop: Callable[[T], None],
    launches: int,
    timeout_s: float = 60.0,
) -> list[list[ColdStart]]:
    """Launch with ``start``, collect every process's cold start, ``stop``; ``launches`` times."""
    rounds = []
    for _ in range(launches):
        target = start()
        try:
            rounds.append(collect_cold_starts(processes(target), timeout_s))
        finally:
            stop(target)
    return rounds


def format_cold_starts(rounds: Sequence[Sequence[ColdStart]]) -> str:
    """p50 and max of each phase per process over ``rounds`` (one list of processes per launch)."""
    names: dict[str, list[ColdStart]] = {}
    for one in rounds:
        for cs in one:
            names.setdefault(cs.name, []).append(cs)
    header = ["process", *(f"{PHASE_TITLES[p]} p50 / max" for p in PHASES)]
    rows = []
    for name, runs in names.items():
        cells = [name]
        for phase in PHASES:
            values = [v for v in (getattr(cs, phase) for cs in runs) if v is not None]
            cells.append(f"{statistics.median(values):.3f} / {max(values):.3f}" if values else "-")
        rows.append(cells)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        f"cold start over {len(rounds)} launch{'es' if len(rounds) != 1 else ''} "
        "(seconds from launch; p50 / max)"
    ]
    for r in [header, *rows]:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    errors = sorted({f"{cs.name}: {cs.error}" for one in rounds for cs in one if cs.error})
    lines += [f"note: {e}" for e in errors]
    return "\n".join(lines)
