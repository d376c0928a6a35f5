"""The collecting side of loadgen inside Locust, shared by the master and the local process:
the run's start and clock, its results directory, the merged histograms, the stop with its drain
barrier (Locust itself waits only 0.5 s for final reports) and the verdict.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Any

import gevent
from gevent.event import Event

from analysis.records import RUN_ABORTED, RUN_COMPLETE
from analysis.slo import parse_slos
from loadgen.config import RunConfig
from loadgen.engine.driver import global_schedule
from loadgen.engine.health import coalescing_counts
from loadgen.engine.health import summarize as summarize_health
from loadgen.engine.plan_stream import count_in_background
from loadgen.engine.recorder import MetricsAggregate
from loadgen.errors import as_user_error
from loadgen.live.progress import ProgressLine
from loadgen.live.snapshot import RunSnapshot
from loadgen.runtime.accounting import Accounting, Share
from loadgen.runtime.base import RuntimeBase, off_the_loop, tell_user
from loadgen.runtime.locust_options import check_session_count, config_from_options
from loadgen.runtime.results_writer import ResultsWriter
from loadgen.runtime.run_record import connections_used, generator_cpu, reader_used, run_info
from loadgen.runtime.run_workload import config_workload
from loadgen.runtime.stop_request import take_sigterm
from loadgen.runtime.verdict import EXIT_INCOMPLETE, EXIT_USAGE, Verdict, decide_verdict

log = logging.getLogger("loadgen")

class Collector(RuntimeBase):
    """The collecting side, which the master and the local process share: the run's start, its
    results directory, the merged histograms, the stop and its drain, and the verdict.

    What differs between them (who drives the load, who is counted) is in the hooks each of
    ``MasterRuntime`` and ``LocalRuntime`` defines: ``_hand_out``, ``_start_load``, ``_drain``,
    ``_in_flight_summary`` and the accounting's per-worker figures.
    """

    def __init__(self, environment: Any) -> None:
        super().__init__(environment)
        self.aggregate = MetricsAggregate()
        self.config: RunConfig | None = None
        self.writer: ResultsWriter | None = None
        self.t0_unix_s = 0.0
        self.t_end_unix_s: float | None = None  # when the run's results were closed
        self._greenlets: list[gevent.Greenlet] = []
        self._interval_start = 0.0
        self._stopping_requested = False
        self._quit_requested = False
        self._abort_reason: str | None = None
        self._planned_end = False
        self._draining = False
        self._drained = Event()
        self._preparing = False  # the run's plan made, its clock not started yet
        self._run_info_doc: dict[str, Any] = {}
        self.n_slots = 0
        self.accounting: Accounting | None = None
        self._count_greenlet: gevent.Greenlet | None = None  # a streamed trace counted during the run
        self._fingerprint_greenlet: gevent.Greenlet | None = None  # hashing a streamed trace
        self._workload: Any = None  # the run's workload (its fingerprint, once hashed)
        self.verdict: Verdict | None = None
        self._verdict_printed = False
        self.progress: ProgressLine | None = None
        self.last_run_dir: Path | None = None
        self.live_view: Any = None
        self.endpoint: Any = None  # the Prometheus /metrics endpoint, with --prometheus-port

    def install(self) -> None:
        ev = self.env.events
        ev.test_start.add_listener(self._on_test_start)
        ev.test_stopping.add_listener(self._on_test_stopping)
        ev.test_stop.add_listener(self._on_test_stop)
        ev.quitting.add_listener(self._on_quitting)
        ev.quit.add_listener(self._on_quit)
        ev.reset_stats.add_listener(self._on_reset_stats)
        if getattr(self.env, "web_ui", None) is not None:
            from loadgen.live.webui import install_web_ui

            self.live_view = install_web_ui(self.env, self.snapshot)
        from loadgen.live.metrics_endpoint import install_endpoint

        self.endpoint = install_endpoint(self.env, self.snapshot)

    # ---------------------------------------------------------------- what the roles define
    def _hand_out(self, cfg: RunConfig, workload: Any) -> None:
        """The run is planned: give its arrivals to whoever drives them (then ``_go``)."""
        raise NotImplementedError

    def _start_load(self, t0_unix_s: float) -> None:
        """The clock starts: the load starts at ``t0_unix_s`` (the results are open)."""
        raise NotImplementedError

    def _drain(self, deadline_s: float) -> None:
        """The stop: wait (up to ``deadline_s`` and its margin) for what is on the wire."""
        raise NotImplementedError

    def _in_flight_summary(self) -> tuple[int, int, int]:
        """(sessions started, sessions in flight, requests in flight) over all drivers."""
        raise NotImplementedError

    def _worker_counts(self) -> dict[str, int]:
        return {}

    def _worker_states(self) -> dict[str, dict[str, Any]]:
        """Each driver's last reported state (its CPU, health, sessions started)."""
        raise NotImplementedError

    def _sessions_started_by_worker(self) -> dict[str, int]:
        return {w: int(s.get("started", 0)) for w, s in self._worker_states().items()}

    def _cancelled_counts(self) -> dict[str, int]:
        raise NotImplementedError

    def _lost_workers(self) -> list[dict[str, Any]]:
        return []

    def _lost_shares(self) -> dict[str, list[Share]]:
        return {}

    def _begin(self, environment: Any) -> None:
        self._begin_run(environment)

    def _prepare_config(self, cfg: RunConfig) -> None:
        """The run's config, validated, before its results directory is named."""

    def _before_results(self) -> None:
        """Just before the results directory opens."""

    def _after_start(self) -> None:
        """The run's timers are started."""

    def _after_results_closed(self) -> None:
        """The verdict is decided."""

    def _on_test_start(self, environment: Any, **_: Any) -> None:
        take_sigterm(self._on_sigterm)
        self._begin(environment)

    def _begin_run(self, environment: Any) -> None:
        try:
            # Off the loop: it opens the workload (a large file's first rows), heartbeats go on.
            cfg = off_the_loop(config_from_options, environment.parsed_options)
            if self.config is not None and self.config.run_id == cfg.run_id:
                # The web UI can start a second test in one process: never overwrite a run.
                cfg.run_id = f"{cfg.run_id}-{int(time.time())}"
            self._start_run(cfg)
        except OSError as e:  # the results directory, checked before load but changed since
            self._fatal(f"--results {environment.parsed_options.results}: cannot write there ({e.strerror or e})", 2)
        except Exception as e:
            user = as_user_error(e)  # a bad option or file (loadgen.errors); anything else is a bug
            if user is None:
                raise
            self._fatal(user.message, 2)

    def _start_run(self, cfg: RunConfig) -> None:
        """Validate, plan the arrivals, hand every worker its plan; the clock starts in ``_go``
        once every worker has loaded it and measured the target's connection set-up."""
        self._reset_collector()
        self.config = cfg
        slos = parse_slos(cfg.slos)
        self.aggregate = MetricsAggregate(slos.request_meets if slos.per_request else None)
        workload = off_the_loop(config_workload, cfg)  # validate before any load is sent
        schedule = None if cfg.concurrency else off_the_loop(global_schedule, cfg, workload)
        if schedule is not None:
            check_session_count(cfg.num_sessions, schedule.available, "the trace" if cfg.arrival == "trace" else "the workload")
        # Off the loop: a closed loop over a streamed trace counts its rows.
        self.accounting = off_the_loop(Accounting.plan, cfg, schedule, workload)
        self._prepare_config(cfg)
        self._count_greenlet = count_in_background(schedule, self.accounting, self._stop_on_bad_trace)
        self.t0_unix_s = 0.0
        self.t_end_unix_s = None
        self.last_run_dir = Path(cfg.results_dir) / cfg.run_id
        self._preparing = True
        self._hand_out(cfg, workload)

    def _go(self, t0_unix_s: float) -> None:
        """The run's clock starts at ``t0_unix_s``: results open, workers are told, timers start."""
        cfg = self.config
        assert cfg is not None
        self._preparing = False
        self.t0_unix_s = t0_unix_s
        self._interval_start = t0_unix_s
        if self.live_view is not None:
            self.live_view.start_over()
        if self.endpoint is not None:
            self.endpoint.invalidate()
        run_dir = Path(cfg.results_dir) / cfg.run_id
        self._before_results()
        self.writer = ResultsWriter(run_dir, self._run_info_doc, t0_unix_s)
        # After the start, not before: hashing a large trace would hold up the workers' set-up.
        self._fingerprint_greenlet = gevent.spawn(self._fill_fingerprint, self._workload)
        log.info("loadgen run %s: results in %s", cfg.run_id, run_dir)
        self._start_load(t0_unix_s)
        if self.accounting is not None:
            self.writer.update_run(accounting=self.accounting.as_dict())
        self.progress = ProgressLine(
            cfg, t0_unix_s, self.aggregate, self._in_flight_summary,
            coalescing=lambda: coalescing_counts(self._worker_states()),
        )  # fmt: skip
        self._greenlets.append(gevent.spawn(self._flush_loop))
        if cfg.duration_s is not None:
            self._greenlets.append(gevent.spawn(self._stop_after, cfg.duration_s))
        self._after_start()

    def _run_info(self, cfg: RunConfig) -> dict[str, Any]:
        info_file = getattr(self.env.parsed_options, "target_info", "") or ""
        return run_info(cfg, role=self.role, target_info_file=info_file)

    def _stop_after(self, duration_s: float) -> None:
        gevent.sleep(max(0.0, self.t0_unix_s + duration_s - time.time()))
        log.info("duration reached, stopping arrivals")
        self._planned_end = True
        self._request_stop()

    def _request_stop(self) -> None:
        if self._stopping_requested:
            return
        self._stopping_requested = True
        runner = self.env.runner
        self._quit_requested = self._headless()
        # Outside the caller's greenlet: quit() kills greenlets, possibly the caller's own.
        gevent.spawn(runner.quit if self._quit_requested else runner.stop)

    def _on_stop_request(self) -> None:
        """The front's stop (``loadgen.runtime.stop_request``): quit the runner as a run that reached its
        end does, then the web UI if there is one (the process ends when it stops serving)."""
        if not self._quit_requested:
            self._quit_requested = self._stopping_requested = True
            gevent.spawn(self._quit_and_stop_serving)

    def _on_sigterm(self) -> None:
        """SIGTERM to this process (or its group): the run stops as on the front's stop request,
        draining what is on the wire, and says it was stopped by a signal."""
        if self.writer is not None and not self._planned_end and not self._abort_reason and not self._stopping_requested:
            self._abort_reason = (
                f"stopped by a signal (SIGTERM) after {time.time() - self.t0_unix_s:.1f} s, before its planned end"
            )
        self._on_stop_request()

    def _quit_and_stop_serving(self) -> None:
        self.env.runner.quit()
        web_ui = getattr(self.env, "web_ui", None)
        if web_ui is not None:
            web_ui.stop()

    def _fatal(self, message: str, code: int) -> None:
        tell_user(logging.ERROR, message)
        self.env.process_exit_code = code
        self.verdict = Verdict(code, message)
        gevent.spawn(self.env.runner.quit)

    def _flush_loop(self) -> None:
        assert self.config is not None
        while True:
            gevent.sleep(self.config.report_interval_s)
            self._collect()
            self._stop_if_unwritable()
            if self.live_view is not None:
                self.live_view.record_history_point()
            if self.progress is not None:
                self.progress.tick()

    def _collect(self) -> None:
        """Merge what arrived since the last call and write it: one hlog interval, flushed records."""
        if self.writer is None:
            return
        self._take_local_records()
        now = time.time()
        self.writer.write_intervals(self.aggregate.take_interval(), self._interval_start, now)
        self._interval_start = now
        self.writer.flush()

    def _take_local_records(self) -> None:
        """Records this process made itself (a local run) join the results here."""

    def _stop_if_unwritable(self) -> None:
        """Results that can no longer be written (disk full, read-only) stop the run: load that
        nobody records is wasted on the target. What reached the disk stays readable."""
        failed = self.writer.failed if self.writer is not None else None
        if failed is None or self._abort_reason == failed:
            return
        self._abort_reason = failed
        tell_user(logging.ERROR, f"{failed}; stopping the run")
        self._request_stop()

    def snapshot(self) -> RunSnapshot:
        """What the live views show of the current run (``loadgen.live.snapshot``)."""
        started, sessions, requests = self._in_flight_summary()
        return RunSnapshot(
            config=self.config,
            aggregate=self.aggregate,
            t0_unix_s=self.t0_unix_s,
            t_end_unix_s=self.t_end_unix_s,
            sessions_started=started,
            sessions_in_flight=sessions,
            requests_in_flight=requests,
            workers=self._worker_counts(),
            coalescing=coalescing_counts(self._worker_states()),
            arrivals_planned=self.accounting.arrivals_planned if self.accounting is not None else None,
        )

    def _on_test_stopping(self, environment: Any, **_: Any) -> None:
        if self.config is not None and self._preparing:
            # Stopped while the workers were still loading the plan: the clock never starts.
            self._stopping_requested = True
            return
        if self.config is None or self.writer is None:
            return
        if self._draining:  # one drain a run, whichever path asked first; the others wait for it
            self._drained.wait()
            return
        self._draining = True
        try:
            self._drain_barrier()
        finally:
            self._drained.set()

    def _drain_barrier(self) -> None:
        assert self.config is not None and self.writer is not None
        self._stopping_requested = True
        deadline = self.config.stop_timeout_s
        self._drain(deadline)

    def _on_test_stop(self, environment: Any, **_: Any) -> None:
        if self.config is not None and self._preparing and self.verdict is None:
            for g in self._greenlets:
                g.kill(block=False)
            self._greenlets = []
            self.verdict = Verdict(
                EXIT_INCOMPLETE, "run incomplete: stopped before its arrivals started (the workers were loading the plan)"
            )
            return
        if self.config is None or self.writer is None:
            return
        for g in self._greenlets:
            g.kill(block=False)
        self._greenlets = []
        self._collect()
        self.t_end_unix_s = time.time()
        if self.live_view is not None:
            self.live_view.invalidate()  # the final numbers at once, not a snapshot from before the end
        cancelled = self._cancelled_counts()
        if not self._planned_end and not self._abort_reason:
            # Stopped by a signal, the UI's stop button or Locust's --run-time before the run's
            # own end (its duration, or every session done): the figures cover only part of it.
            self._abort_reason = (
                f"stopped after {time.time() - self.t0_unix_s:.1f} s, before its planned end "
                "(interrupted, stop button, or Locust's --run-time)"
            )
        status = RUN_ABORTED if self._abort_reason else RUN_COMPLETE
        accounting = self._close_accounting(aborted=status == RUN_ABORTED)
        self.writer.finish(
            status,
            requests_recorded=self.writer.records_written,
            cancelled_at_stop=cancelled,
            lost_workers=self._lost_workers(),
            abort_reason=self._abort_reason,
            generator=self._generator_cpu(),
            accounting=accounting,
            **reader_used(self._worker_states()),
            **connections_used(self.config.connections, self._worker_states()),
        )
        if self.progress is not None:
            self.progress.finish()
        failed, run_dir, self.writer = self.writer.failed, self.writer.dir, None
        if failed is not None:
            # No summary: it could not be written either. The records on disk are the run. Nor
            # Locust's own table (--json-file, written at exit): it would end in a traceback.
            if getattr(self.env.parsed_options, "json_file", None):
                self.env.parsed_options.json_file = None
            self.verdict = Verdict(
                EXIT_INCOMPLETE,
                f"run incomplete: {failed}; what was written is readable with 'loadgen report {run_dir}' "
                "once there is room",
            )
        else:
            # A usage error found during the run (a bad row of a streamed trace) stays the verdict.
            fatal = self.verdict if self.verdict is not None and self.verdict.exit_code == EXIT_USAGE else None
            self.verdict = fatal or decide_verdict(run_dir, self.config, self.env)
            if self.live_view is not None:
                # In the web UI the run's end is its end: its report at once, shown with the verdict.
                report = self._write_report(run_dir)
                self.live_view.run_ended(self.config.run_id, self.verdict.line, self.verdict.exit_code, report)
                print(self.verdict.line + (f"\nreport: {report}" if report else ""), file=sys.stderr, flush=True)
        if self.endpoint is not None:
            try:
                self.endpoint.run_ended(run_dir)
            except OSError as e:
                log.error("cannot write the final metrics snapshot in %s: %s", run_dir, e)
        self._after_results_closed()

    def _write_report(self, run_dir: Path) -> Path | None:
        """report.html of a finished run (off the loop: its charts take a moment); None if it fails,
        which the log says (the results stay, and ``loadgen report`` can write it later)."""
        from analysis.report import write_report

        try:
            return off_the_loop(write_report, run_dir)
        except Exception as e:  # a report bug must not take the verdict or the next run with it
            log.error("cannot write the report of %s (%s); 'loadgen report %s --html' retries", run_dir, e, run_dir)
            return None

    def _fill_fingerprint(self, workload: Any) -> None:
        """A streamed trace's fingerprint hashes its bytes: in a thread, while the run goes on,
        into run.json when done (``run_record.run_info`` left it null)."""
        doc = self._run_info_doc.get("workload")
        if workload is None or not isinstance(doc, dict) or doc.get("fingerprint") is not None:
            return
        try:
            doc["fingerprint"] = off_the_loop(workload.fingerprint)
        except OSError as e:  # the file went away since the start: the run goes on, unpaired
            log.warning("%s: cannot hash the workload for run.json (%s)", doc.get("source"), e.strerror or e)
            return
        if self.writer is not None:
            self.writer.update_run(workload=doc)

    def _stop_on_bad_trace(self, message: str) -> None:
        """A streamed trace's count found a bad row during the run: stop, naming it (exit 2)."""
        self._abort_reason = message
        self._fatal(message, EXIT_USAGE)

    def _close_accounting(self, *, aborted: bool) -> dict[str, Any] | None:
        if self._fingerprint_greenlet is not None:  # run.json's last write carries it
            self._fingerprint_greenlet.join()
        acc = self.accounting
        if acc is None:
            return None
        if self._count_greenlet is not None:  # the planned count of a streamed trace, if still going
            self._count_greenlet.join(timeout=0 if aborted else None)
        started = self._sessions_started_by_worker()
        lost_shares = self._lost_shares()
        # Off the loop: a streamed trace's lost shares are counted by reading the file again.
        off_the_loop(lambda: acc.close(started_by_worker=started, lost_shares=lost_shares, aborted=aborted))
        return acc.as_dict()

    def _generator_cpu(self) -> dict[str, Any]:
        """Each worker's CPU seconds and share of one core over its part of the run."""
        states = self._worker_states()
        return {**generator_cpu(states), **summarize_health(states)}

    def _on_quitting(self, environment: Any, **_: Any) -> None:
        if self.writer is not None:
            # Quit without a stop: Locust's SIGTERM handler (a signal to this process or its
            # group, timeout(1), a dying parent). The run still drains and closes as any stop.
            if not self._stopping_requested and not self._planned_end and not self._abort_reason:
                self._abort_reason = (
                    f"stopped by a signal (SIGTERM) after {time.time() - self.t0_unix_s:.1f} s, before its planned end"
                )
            self._on_test_stopping(environment)
            self._on_test_stop(environment)
        elif self.config is not None and self._preparing and self.verdict is None:
            self.verdict = Verdict(
                EXIT_INCOMPLETE, "run incomplete: stopped before its arrivals started (the workers were loading the plan)"
            )
        if self.verdict is not None:
            environment.process_exit_code = self.verdict.exit_code
        if self.endpoint is not None:
            # After the results closed, so a last scrape sees the final numbers.
            self.endpoint.linger()

    def _on_quit(self, **_: Any) -> None:
        # Printed here, not in quitting: Locust prints its own tables after quitting (when not
        # given --json-file), and the verdict must be the last line a CI log shows.
        if self.verdict is not None and not self._verdict_printed:
            self._verdict_printed = True  # Locust's SIGTERM path (kill <pid>) shuts down twice
            if self.accounting is not None and self.t0_unix_s:
                print(self.accounting.line(), file=sys.stderr, flush=True)
            print(self.verdict.line, file=sys.stderr, flush=True)

    def _on_reset_stats(self, **_: Any) -> None:
        # The UI's reset button resets our live histograms too (the files keep everything).
        self.aggregate.reset_live()
        if self.live_view is not None:
            self.live_view.reset()
        if self.endpoint is not None:
            self.endpoint.invalidate()

    def _reset_collector(self) -> None:
        """A new run in this process (the web UI can start one after another): nothing carried over."""
        self.aggregate = MetricsAggregate()
        self._stopping_requested = False
        self._quit_requested = False
        self._abort_reason = None
        self._planned_end = False
        self._draining = False
        self._drained = Event()
        self._preparing = False
        self.accounting = None
        self.verdict = None
