"""GPU power during a run (``--power-metrics``): a background loop in the front process.

While Locust runs, a thread reads every GPU host's exporter page about once a second
(``targets.power`` parses it), and appends one line per scrape to ``power.jsonl`` in the run's
directory, which ``analysis/energy.py`` turns into the energy over the measurement window. Each
scrape has its own deadline and a bounded body, so a slow or hostile endpoint costs at most that
per second and never the run: its failures are lines in the file (the summary says how many, in
one note), and the first failure of each endpoint is one warning line on stderr. After the last
scrape the loop also writes ``power-live.json`` each second: the energy since the run's start and
its average power, which the master's ``/metrics`` exports (``loadgen/live/prometheus.py``).

``--power-metrics embedded`` stands for every replica of the embedded fleet (each sim serves a
modelled GPU power in dcgm-exporter's names at ``/dcgm/metrics``, docs/sim.md), each tied to the
run's target.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from analysis.energy import POWER_FILE, SourceSeries, energy_between
from loadgen.errors import UserError
from targets.power import (
    MAX_PAGE_BYTES,
    EnergyCounter,
    PowerPageError,
    PowerSource,
    parse_power_metrics,
    parse_power_page,
)

LIVE_FILE = "power-live.json"
INTERVAL_S = 1.0
SCRAPE_TIMEOUT_S = 2.0  # a scrape's whole deadline: connect, headers and body
EMBEDDED = "embedded"
FLAG = "--power-metrics"


def check(opts: Any) -> None:
    """What the flag's row cannot check alone: ``embedded`` needs the embedded fleet."""
    if (getattr(opts, "power_metrics", None) or "").strip() == EMBEDDED and opts.target:
        raise UserError(f"{FLAG} embedded: the run has a --target, not the embedded fleet; give the exporter's URL (URL or TARGET=URL)")


def sources_for(text: str, target_info: dict[str, Any], target_label: str | None) -> list[PowerSource]:
    """The endpoints to scrape: the flag's, or with ``embedded`` each embedded replica's /metrics."""
    if text.strip() != EMBEDDED:
        return parse_power_metrics(FLAG, text)
    replicas = (target_info.get("fleet") or {}).get("replicas") or []
    if not replicas:
        raise UserError(f"{FLAG} embedded: the run has no embedded fleet; give the exporter URL (URL or TARGET=URL)")
    return [
        PowerSource(r.get("server_id") or f"replica-{i}", f"{r['url'].rstrip('/')}/dcgm/metrics", target_label)
        for i, r in enumerate(replicas)
    ]


class PowerScraper:
    """The loop: ``start()`` before the load, ``stop()`` after it (one last scrape, then joined).

    Each endpoint has its own thread, so a slow one (up to its 2 s deadline a scrape) never thins
    the others' scrapes; one more thread writes the live figures each second."""

    def __init__(self, sources: list[PowerSource], run_dir: Path, *, interval_s: float = INTERVAL_S, quiet: bool = False) -> None:
        self.sources = sources
        self.run_dir = run_dir
        self.interval_s = interval_s
        self.quiet = quiet
        self._counters = {s.name: EnergyCounter() for s in sources}
        self._series = {s.name: SourceSeries(s.name, s.url, s.target) for s in sources}
        self._warned: set[str] = set()
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one writer at a time for power.jsonl and the series
        self._threads = [threading.Thread(target=self._loop, args=(s,), name=f"power-{s.name}", daemon=True) for s in sources]
        self._threads.append(threading.Thread(target=self._live_loop, name="power-live", daemon=True))
        self._t0_unix_s: float | None = None
        self._write_failed = False

    def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.scrape_all()  # one before the load starts: the window's start is always bracketed
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=SCRAPE_TIMEOUT_S + 5.0)
        self.scrape_all()  # one after the load ended: the window's end is always bracketed
        self._write_live()

    def _loop(self, s: PowerSource) -> None:
        next_at = time.monotonic() + self.interval_s
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            self._append(self.scrape(s))
            next_at = max(next_at + self.interval_s, time.monotonic())

    def _live_loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._write_live()

    def scrape_all(self) -> None:
        """One scrape of every endpoint at once (each in its own thread: one deadline for all)."""
        rows: list[dict[str, Any]] = []
        threads = [threading.Thread(target=lambda s=s: rows.append(self.scrape(s)), daemon=True) for s in self.sources]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=SCRAPE_TIMEOUT_S + 5.0)
        for row in list(rows):
            self._append(row)

    def scrape(self, s: PowerSource) -> dict[str, Any]:
        """One scrape of ``s`` as the line ``power.jsonl`` keeps."""
        from targets.scrape import http_get

        row: dict[str, Any] = {"source": s.name, "url": s.url, "target": s.target}
        t_start = time.time()
        try:
            status, _, body = http_get(s.url, SCRAPE_TIMEOUT_S, max_bytes=MAX_PAGE_BYTES)
            t = (t_start + time.time()) / 2.0  # the page's moment: midway through the request
            if status != 200:
                raise PowerPageError(f"HTTP {status}")
            if len(body) > MAX_PAGE_BYTES:
                raise PowerPageError(f"the page is over {MAX_PAGE_BYTES >> 20} MiB, not an exporter's")
            reading = parse_power_page(body.decode("utf-8", "replace"), "the page")
        except (OSError, ValueError) as e:  # PowerPageError is a ValueError
            why = " ".join(str(e).split()) or type(e).__name__
            row.update(t_unix_s=t_start, error=why[:300])
            self._warn(s, why)
            return row
        with self._lock:  # a source's loop and the last scrape_all may overlap by a scrape
            energy = self._counters[s.name].add(reading.energy_j_by_gpu)
            self._series[s.name].add(t, reading.power_w, energy)
        row.update(t_unix_s=t, power_w=reading.power_w, energy_j=energy, gpus=reading.gpus, exporter=reading.exporter)
        return row

    def _warn(self, s: PowerSource, why: str) -> None:
        if s.name in self._warned or self.quiet:
            return
        self._warned.add(s.name)
        print(f"warning: {FLAG} {s.url}: {why[:200]}; the summary says how many scrapes failed", file=sys.stderr, flush=True)

    def _append(self, row: dict[str, Any]) -> None:
        try:
            with self._lock, open(self.run_dir / POWER_FILE, "ab") as f:
                f.write(orjson.dumps(row) + b"\n")
        except OSError as e:
            if not self._write_failed:
                self._write_failed = True
                print(f"warning: {FLAG}: cannot write {self.run_dir / POWER_FILE} ({e.strerror or e}); no energy figures", file=sys.stderr, flush=True)

    def _run_t0(self) -> float | None:
        if self._t0_unix_s is None:
            try:
                t0 = orjson.loads((self.run_dir / "run.json").read_bytes()).get("t0_unix_s")
            except (OSError, orjson.JSONDecodeError, AttributeError):
                return None
            self._t0_unix_s = float(t0) if isinstance(t0, int | float) and t0 > 0 else None
        return self._t0_unix_s

    def live(self) -> dict[str, Any] | None:
        """Energy since the run's start per endpoint, for the master's /metrics; None before it starts."""
        t0 = self._run_t0()
        if t0 is None:
            return None
        out = []
        with self._lock:
            series = {name: SourceSeries(s.name, s.url, s.target, list(s.times_s), list(s.power_w), list(s.energy_j))
                      for name, s in self._series.items()}  # fmt: skip
        for name, s in series.items():
            if not s.times_s or s.times_s[-1] <= t0:
                continue
            w = energy_between(s, t0, s.times_s[-1])
            if w.energy_j is None:
                continue
            elapsed = s.times_s[-1] - t0
            out.append({"source": name, "target": s.target or "", "energy_j": w.energy_j,
                        "average_power_w": w.energy_j / elapsed if elapsed > 0 else None,
                        "power_w": s.power_w[-1], "t_unix_s": s.times_s[-1]})  # fmt: skip
        return {"t0_unix_s": t0, "complete": len(out) == len(self._series), "sources": out}

    def _write_live(self) -> None:
        live = self.live()
        if live is None:
            return
        path = self.run_dir / LIVE_FILE
        tmp = path.with_name(path.name + ".tmp")
        try:
            tmp.write_bytes(orjson.dumps(live))
            tmp.replace(path)
        except OSError:
            pass  # the live gauges are a view; power.jsonl (warned above) is the record


def resummarize(run_dir: Path) -> str | None:
    """After the last scrape: summary.json again (the master wrote it before that scrape, so a window
    that ended within the last second lacked its end), and the energy line when the master's table
    had no figure and this one has. None when there is nothing to add."""
    from analysis.summary import write_summary
    from analysis.summary_format import energy_lines

    path = run_dir / "summary.json"
    if not path.exists():
        return None
    try:
        before = (orjson.loads(path.read_bytes()).get("energy") or {}).get("energy_j")
        after = orjson.loads(write_summary(run_dir).read_bytes())
    except Exception:  # the master's summary stands; a second pass must never hide it
        return None
    if before is None and (after.get("energy") or {}).get("energy_j") is not None:
        return "\n".join(["energy, with the GPU power scrape after the load (summary.json updated):", *energy_lines(after)])
    return None


def start(opts: Any, target_info: dict[str, Any]) -> PowerScraper | None:
    """The loop for a run with ``--power-metrics`` (started, one scrape taken), else None."""
    if not getattr(opts, "power_metrics", None):
        return None
    run_dir = Path(opts.results) / opts.run_id
    scraper = PowerScraper(sources_for(opts.power_metrics, target_info, opts.target_label), run_dir, quiet=opts.quiet)
    scraper.start()
    return scraper


def report(scraper: PowerScraper | None) -> None:
    """After the loop stopped (its last scrape taken): rewrite summary.json with it, and print the
    energy line the master's table lacked, if any."""
    if scraper is None or not (scraper.run_dir / POWER_FILE).exists():
        return
    line = resummarize(scraper.run_dir)
    if line:
        print(line, flush=True)
