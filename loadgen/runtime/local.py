"""A local run (``--workers 0``, or a plain ``locust -f``): one process drives the load, records
it and writes the results, with the master's collecting side (``collector.py``) and no messages."""

from __future__ import annotations

import logging
import time
from typing import Any

import gevent

from loadgen.config import Plan, RunConfig
from loadgen.engine.driver import Driver
from loadgen.runtime.base import START_LEAD_LOCAL_S
from loadgen.runtime.collector import Collector

log = logging.getLogger("loadgen")


class LocalRuntime(Collector):
    """Both sides in one process: the collector drives its own driver."""

    role = "local"

    def _hand_out(self, cfg: RunConfig, workload: Any) -> None:
        self._run_info_doc = self._run_info(cfg)
        self._workload = workload
        self.n_slots = 1
        self._prepare_driver(Plan(cfg, 1, 0, 0.0), worker_id="local")
        self._go(time.time() + START_LEAD_LOCAL_S)

    def _start_load(self, t0_unix_s: float) -> None:
        assert self.driver is not None
        self._cpu_at_plan = time.process_time()
        self._wall_at_plan = time.monotonic()
        self.driver.start(t0_unix_s)
        self._greenlets.append(gevent.spawn(self._local_done_watch, self.driver))

    def _local_done_watch(self, driver: Driver) -> None:
        driver.done.wait()
        if driver is self.driver and not driver.stopping:
            log.info("all sessions finished")
            self._planned_end = True
            self._request_stop()

    def _take_local_records(self) -> None:
        assert self.writer is not None
        records = self.aggregate.merge_local(*self.recorder.take())
        self.writer.append_records(records)
        if self.accounting is not None:
            self.accounting.count(records)

    def _drain(self, deadline_s: float) -> None:
        if self.driver is not None:
            self.driver.drain(deadline_s)
            self._collect()

    def _in_flight_summary(self) -> tuple[int, int, int]:
        d = self.driver
        return (d.sessions_started, len(d.in_flight.sessions), d.in_flight.requests) if d else (0, 0, 0)

    def _worker_counts(self) -> dict[str, int]:
        return {"active": 1} if self.driver is not None else {}

    def _worker_states(self) -> dict[str, dict[str, Any]]:
        return {"local": self._driver_state(final=True)} if self.driver else {}

    def _sessions_started_by_worker(self) -> dict[str, int]:
        return {"local": self.driver.sessions_started if self.driver else 0}

    def _cancelled_counts(self) -> dict[str, int]:
        d = self.driver
        return {"requests": d.requests_cancelled, "sessions": d.sessions_cancelled} if d else {}
