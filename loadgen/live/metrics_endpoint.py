"""The master's live ``/metrics`` endpoint for Prometheus (``--prometheus-port``).

Served by ``gevent.pywsgi.WSGIServer`` inside the master process: gevent is already the master's
event loop, so the server is a listening socket plus one greenlet per scrape, with no thread, no
extra dependency, and nothing that depends on Locust's web UI (off in headless runs). Reading the
socket and writing the reply never block the loop; building the text costs a few milliseconds
(one cumulative sum per histogram, one percentile query) and is cached for a second, so any
number of scrapers costs at most that once a second. Token timing happens in the workers, never
here.

Lifetime: bound when the master starts (a port in use is a one-line error, exit 2), serving the
current run's numbers from its start, and its final numbers from the moment the results close
until the process exits. At the run's end the same text is written to ``metrics.prom`` in the
results directory (the final state, for a textfile collector or a Pushgateway), and
``--prometheus-linger`` keeps a headless master up that long so a last scrape sees it.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from gevent.event import Event
from gevent.pywsgi import WSGIServer

from analysis.units import parse_duration_s
from loadgen.errors import UserError
from loadgen.live.exposition import CONTENT_TYPE, render
from loadgen.live.prometheus import collect
from loadgen.live.snapshot import SnapshotSource

log = logging.getLogger("loadgen")

SNAPSHOT_FILE = "metrics.prom"
CACHE_S = 1.0  # scrapes within this long of the last render get the same text


def bind_error(host: str, port: int, err: OSError) -> UserError:
    if err.errno == errno.EADDRINUSE:
        why = "is in use; choose a free port or stop what listens there"
    elif err.errno == errno.EACCES:
        why = "needs privileges; choose a port above 1023"
    else:
        why = f"cannot be bound ({err.strerror or err}); check --prometheus-host"
    return UserError(f"--prometheus-port {port}: {host}:{port} {why}")


def check_bindable(host: str, port: int) -> None:
    """Raise a one-line UserError now if the endpoint could not bind ``host:port`` later."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        # As the server will: a port left in TIME_WAIT by an earlier run is free, a listener is not.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            s.listen(1)
        except OSError as e:
            raise bind_error(host, port, e) from None


class MetricsEndpoint:
    def __init__(self, snapshot: SnapshotSource, host: str, port: int, linger_s: float = 0.0) -> None:
        self._snapshot = snapshot
        self.host = host
        self.port = port
        self.linger_s = linger_s
        self._server: WSGIServer | None = None
        self._cache: tuple[float, str] | None = None
        self._final = False  # the run's results are closed: its numbers no longer change
        self._stop_linger = Event()
        self._lingering = False

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def start(self) -> None:
        server = WSGIServer((self.host, self.port), self._app, log=None, error_log=log)
        try:
            server.start()
        except OSError as e:
            raise bind_error(self.host, self.port, e) from None
        self._server = server

    def close(self) -> None:
        if self._server is not None:
            self._server.stop(timeout=1.0)
            self._server = None

    # ---------------------------------------------------------------- content
    def text(self) -> str:
        now = time.monotonic()
        if self._cache is not None and (self._final or now - self._cache[0] < CACHE_S):
            return self._cache[1]
        body = render(collect(self._snapshot()))
        self._cache = (now, body)
        return body

    def invalidate(self) -> None:
        """Rebuild at the next scrape: a run started, or the web UI reset the numbers."""
        self._final = False
        self._cache = None

    def run_ended(self, run_dir: Path) -> Path:
        """The run's results are closed: serve its final numbers, and keep them as ``metrics.prom``."""
        self.invalidate()
        body = self.text()
        self._final = True
        path = Path(run_dir) / SNAPSHOT_FILE
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(body)
        os.replace(tmp, path)
        return path

    def _app(self, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        path = environ.get("PATH_INFO", "")
        if path != "/metrics":
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"loadgen serves /metrics only\n"]
        if environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [("Allow", "GET, HEAD")])
            return [b""]
        body = self.text().encode()
        start_response("200 OK", [("Content-Type", CONTENT_TYPE), ("Content-Length", str(len(body)))])
        return [b""] if environ.get("REQUEST_METHOD") == "HEAD" else [body]

    # ---------------------------------------------------------------- end of process
    def linger(self) -> None:
        """Keep serving the final numbers for ``linger_s`` before the process exits.

        A second call (Locust's SIGTERM handler shuts down again while this one waits) ends the
        wait at once instead of starting another.
        """
        if self._lingering:
            self._stop_linger.set()
            return
        if self.linger_s <= 0 or self._server is None or self._snapshot().t_end_unix_s is None:
            return
        self._lingering = True
        print(f"final metrics served at {self.url} for {self.linger_s:g} s", file=sys.stderr, flush=True)
        try:
            self._stop_linger.wait(timeout=self.linger_s)
        except KeyboardInterrupt:
            pass


def install_endpoint(environment: Any, snapshot: SnapshotSource) -> MetricsEndpoint | None:
    """Start the endpoint when ``--prometheus-port`` is given; a bind failure exits 2 with one line."""
    options = environment.parsed_options
    port = int(getattr(options, "prometheus_port", 0) or 0)
    if not port:
        return None
    host = getattr(options, "prometheus_host", "127.0.0.1") or "127.0.0.1"
    try:
        linger_s = parse_duration_s(getattr(options, "prometheus_linger", "0s") or "0s")
        endpoint = MetricsEndpoint(snapshot, host, port, linger_s)
        endpoint.start()
    except (UserError, ValueError) as e:
        message = e.message if isinstance(e, UserError) else f"--prometheus-linger: {e}"
        # Called while Locust initialises: nothing runs yet, and an exception would only be logged.
        print(f"Error: {message}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    log.info("Prometheus metrics on %s", endpoint.url)
    return endpoint


__all__ = ["SNAPSHOT_FILE", "MetricsEndpoint", "check_bindable", "install_endpoint"]
