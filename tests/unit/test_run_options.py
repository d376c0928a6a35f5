"""The options table (loadgen/runtime/run_options.py) is the one declaration of a run's options:
the click commands, Locust's parser and web form, the front's RunOptions, the flags the front
passes to Locust and the plan's fields all follow from it, and a mistake says the same line on
either side."""

from __future__ import annotations

import argparse
from dataclasses import fields

import click
import pytest
from click.testing import CliRunner

from loadgen.cli import main
from loadgen.config import RunConfig
from loadgen.errors import UserError
from loadgen.runtime.locust_options import add_arguments, config_from_options
from loadgen.runtime.run_options import (
    AB,
    FLAG,
    LOAD_COMMANDS,
    MASTER,
    RUN,
    RUN_OPTIONS,
    SWEEP,
    WORKER,
    RunOptions,
    locust_args,
    locust_options,
    options_of,
)

# Each command's own options beside its rows of the table (they are not a run's options).
OWN = {
    RUN: set(),
    MASTER: set(),
    WORKER: {"--master-host", "--processes"},
    AB: {"--arms", "--predict"},
    SWEEP: {"--rates", "--search", "--min-rate", "--max-rate", "--steps", "--max-error-rate"},
}
# RunConfig fields no option fills: file contents the master ships, what it derives from several
# options, and settings with no flag.
NOT_FROM_AN_OPTION = {
    "workload_text", "trace_text", "tokenizer_json", "ca_cert_pem", "workload_pull_bytes", "trace_rate_per_s",
    "max_schedule_lag_explicit", "target_url", "connect_timeout_s", "extra_headers", "target_labels",
    "report_interval_s",
}  # fmt: skip


class _LocustLikeParser(argparse.ArgumentParser):
    """argparse with the one keyword Locust's parser adds; records which arguments it puts on the web form."""

    def __init__(self) -> None:
        self.web_form: list[str] = []
        super().__init__()

    def add_argument(self, *a, include_in_web_ui: bool = True, **k):  # type: ignore[override]
        if include_in_web_ui:
            self.web_form.append(a[0])
        return super().add_argument(*a, **k)


def _locust_parser() -> _LocustLikeParser:
    p = _LocustLikeParser()
    p.add_argument("--host", default="")
    add_arguments(p)
    return p


def _flags(command: click.Command) -> set[str]:
    return {o for p in command.params if isinstance(p, click.Option) for o in p.opts if o.startswith("--")} - {"--help"}


@pytest.mark.parametrize("name", [RUN, MASTER, WORKER, AB, SWEEP])
def test_each_command_takes_exactly_its_rows(name: str) -> None:
    command = main.get_command(click.Context(main), name)
    assert _flags(command) == {o.flag for o in options_of(name)} | OWN[name]
    defaults = {p.opts[0]: p.default for p in command.params if isinstance(p, click.Option)}
    for row in options_of(name):
        if row.kind != FLAG:  # a flag is off unless given
            assert defaults[row.flag] == row.default, row.flag


def test_locusts_parser_and_web_form_come_from_the_table() -> None:
    p = _locust_parser()
    dests = {a.option_strings[0] for a in p._actions if a.option_strings and a.option_strings[0] != "-h"}
    assert dests == {"--host", *(o.locust for o in locust_options())}
    assert set(p.web_form) - {"--host", "-h"} == {o.locust for o in locust_options() if o.web_form}
    # Every value is text or a flag: Locust's web form keeps a value's type, and an int there once
    # meant a number typed wrong in the form failed in the form's handler instead of saying why.
    for action in p._actions:
        if action.option_strings and action.dest not in ("help", "host"):
            assert isinstance(action.default, (str, bool)), action.option_strings


def test_every_plan_field_is_an_options_or_said_otherwise() -> None:
    filled = {o.field for o in RUN_OPTIONS if o.field}
    names = {f.name for f in fields(RunConfig)}
    assert filled <= names
    assert names - filled == NOT_FROM_AN_OPTION
    # A field the workers need comes through Locust's parser (the plan is built in the master).
    assert all(o.locust for o in RUN_OPTIONS if o.field)


def test_the_fronts_values_reach_the_plan_through_locusts_flags(tmp_path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    opts = RunOptions(
        workload="tiny", seed=7, arrival="gamma", rate="30/min", burstiness=0.123456789, concurrency=0, num_sessions=5,
        duration="2m", warmup="1s", adapter="openai-completions", adapter_options="foo=1", model="m",
        session_header="X-S", target_label="lab", target_kind="vllm", cost_per_hour=1234567.25, request_timeout="7s",
        first_byte_timeout="2s", idle_timeout="3s", retry_after_cap="4s", ca_cert=str(ca), stop_timeout="9s",
        slo="ttft_p99=500ms,itl_p99=50ms", max_schedule_lag="20ms", results=str(tmp_path / "res"), run_id="r1",
        on_worker_loss="abort",
    )  # fmt: skip
    argv = ["--host", "https://127.0.0.1:1", *locust_args(opts)]
    cfg = config_from_options(_locust_parser().parse_args(argv))
    assert (cfg.workload, cfg.seed, cfg.arrival, cfg.rate_per_s, cfg.burstiness) == ("tiny", 7, "gamma", 0.5, 0.123456789)
    assert (cfg.num_sessions, cfg.concurrency, cfg.duration_s, cfg.warmup_s) == (5, None, 120.0, 1.0)
    assert (cfg.adapter, cfg.adapter_options, cfg.model) == ("openai-completions", {"foo": 1}, "m")
    assert (cfg.session_header, cfg.target_label, cfg.target_kind, cfg.cost_per_hour_usd) == ("X-S", "lab", "vllm", 1234567.25)
    assert (cfg.request_timeout_s, cfg.first_byte_timeout_s, cfg.idle_timeout_s, cfg.retry_after_cap_s) == (7, 2, 3, 4)
    assert (cfg.ca_cert, cfg.ca_cert_pem, cfg.stop_timeout_s) == (str(ca), "-----BEGIN CERTIFICATE-----\n", 9.0)
    assert cfg.slos == ["ttft_p99=500ms", "itl_p99=50ms"]
    assert (cfg.max_schedule_lag_us, cfg.max_schedule_lag_explicit) == (20_000, True)
    assert (cfg.results_dir, cfg.run_id, cfg.on_worker_loss) == (str(tmp_path / "res"), "r1", "abort")


def test_the_defaults_give_the_same_plan_from_the_front_and_from_locust_alone() -> None:
    from_front = config_from_options(_locust_parser().parse_args(["--host", "http://127.0.0.1:1", *locust_args(RunOptions())]))
    stock = config_from_options(_locust_parser().parse_args(["--host", "http://127.0.0.1:1"]))
    a, b = from_front.to_dict(), stock.to_dict()
    a.pop("run_id"), b.pop("run_id")
    assert a == b


# One bad value per kind of row; the front (click) and the Locust process must say the same line.
BAD = [
    ("--seed", "x", "--seed 'x': not a whole number"),
    ("--concurrency", "-1", "--concurrency -1: must be 0 or more"),
    ("--burstiness", "0", "--burstiness 0: must be a number above 0 (1 = Poisson, < 1 burstier)"),
    ("--trace-time-scale", "nan", "--trace-time-scale nan: must be a number above 0"),
    ("--cost-per-hour", "-2", "--cost-per-hour -2: must be 0 or more"),
    ("--rate", "fast", "--rate: 'fast' is not a rate"),
    ("--duration", "ten", "--duration: 'ten' is not a duration"),
    ("--idle-timeout", "soon", "--idle-timeout: 'soon' is not a duration"),
    ("--arrival", "bursty", "--arrival 'bursty': choose one of auto, poisson, gamma, constant, trace"),
    ("--trace", "/no/such/trace.txt", "--trace /no/such/trace.txt: no such file"),
    ("--slo", "ttft_p99=quick", "--slo: "),
    ("--api-key-env", "LOADGEN_TEST_UNSET_VAR", "--api-key-env LOADGEN_TEST_UNSET_VAR: that environment variable is not set"),
    ("--adapter-options", "oops", "--adapter-options 'oops' is not key=value"),
]


@pytest.mark.parametrize(("flag", "value", "message"), BAD)
def test_a_mistake_is_one_line_and_the_same_on_either_side(flag: str, value: str, message: str, tmp_path) -> None:
    r = CliRunner().invoke(main, ["run", flag, value, "--results", str(tmp_path / "r")])
    front = r.output.strip().splitlines()
    assert r.exit_code == 2 and len(front) == 1 and front[0].startswith("Error: " + message), r.output
    if flag == "--arrival":
        # Locust's parser has the choices (its web form shows them as a list): argparse refuses first.
        with pytest.raises(SystemExit):
            _locust_parser().parse_args(["--host", "http://127.0.0.1:1", flag, value])
        return
    with pytest.raises(UserError) as e:
        config_from_options(_locust_parser().parse_args(["--host", "http://127.0.0.1:1", flag, value]))
    assert front[0] == f"Error: {e.value.message}"
    assert not (tmp_path / "r").exists()


def test_an_emptied_web_form_field_is_its_default() -> None:
    # Locust's form sends "" for a field the user cleared: the run takes the default, not None.
    cfg = config_from_options(_locust_parser().parse_args(["--host", "http://127.0.0.1:1", "--burstiness", "", "--request-timeout", ""]))
    assert (cfg.burstiness, cfg.request_timeout_s) == (1.0, 300.0)


def test_a_row_says_which_processes_need_it() -> None:
    by_flag = {o.flag: o for o in RUN_OPTIONS}
    assert by_flag["--idle-timeout"].processes == ("front", "master", "workers")
    assert by_flag["--replicas"].processes == ("front",)
    assert by_flag["--prometheus-port"].processes == ("front", "master")
    assert {o.flag for o in RUN_OPTIONS if o.commands >= LOAD_COMMANDS} >= {"--workload", "--rate", "--slo"}
