"""``loadgen serve fleet``: N replicas behind a real router, up until Ctrl-C or SIGTERM."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from targets.errors import TargetError
from targets.fleet.coldstart import format_cold_starts, measure_cold_starts
from targets.fleet.fleet import ENGINES, serve_fleet, start_fleet
from targets.fleet.routers import RouterSpecError, parse_router_spec


class FleetUsageError(click.ClickException):
    """A fleet that cannot start as asked: `Error: <message>` on one line, exit 2."""

    exit_code = 2


class RouterSpecType(click.ParamType):
    """``sglang:<policy>``, ``vllm:<policy>`` or ``none``."""

    name = "router"

    def convert(self, value, param, ctx):
        if not isinstance(value, str):
            return value
        try:
            parse_router_spec(value)
        except RouterSpecError as e:
            self.fail(str(e), param, ctx)
        return value


@click.command("fleet")
@click.option("--replicas", type=click.IntRange(min=1), default=2, show_default=True, help="Engine replicas.")
@click.option("--engine", type=click.Choice(ENGINES), default="sim", show_default=True)
@click.option("--profile", default="tiny", show_default=True, help="Sim profile (engine sim).")
@click.option(
    "--time-scale", type=click.FloatRange(min=0), default=1.0, show_default=True,
    help="Sim wall seconds per simulated second; 0.1 runs ten times faster, 0 as fast as possible.",
)  # fmt: skip
@click.option(
    "--seed", type=int, default=0, show_default=True, help="Fleet seed; replica seeds derive from it."
)
@click.option(
    "--router", "router", type=RouterSpecType(), default="sglang:cache_aware", show_default=True,
    help="sglang:<policy>, vllm:<policy> or none (one replica only).",
)  # fmt: skip
@click.option(
    "--router-port", type=click.IntRange(1, 65535), default=None, help="Router port [default: a free one]."
)
@click.option(
    "--router-arg", "router_args", multiple=True, metavar="FLAG",
    help="Extra router flag, repeatable; e.g. --router-arg=--disable-retries.",
)  # fmt: skip
@click.option(
    "--log-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
    help="Where process logs go [default: a new temporary directory].",
)  # fmt: skip
@click.option("--startup-timeout", type=click.FloatRange(min=0, min_open=True), default=60.0, show_default=True,
              help="Seconds each replica and the router get to become healthy.")  # fmt: skip
@click.option("--measure-cold-start", "measure_launches", type=click.IntRange(min=1), default=None, metavar="N",
              help="Launch the fleet N times (launch -> listening -> healthy -> first token), print p50/max, exit.")  # fmt: skip
def fleet_command(
    replicas, engine, profile, time_scale, seed, router, router_port, router_args, log_dir, startup_timeout,
    measure_launches,
):  # fmt: skip
    """Start a local fleet and print its URLs, the router's first; Ctrl-C or SIGTERM stops it."""
    if measure_launches:
        fleet_args = dict(
            replicas=replicas, engine=engine, profile=profile, time_scale=time_scale, seed=seed, router=router,
            router_port=router_port, router_args=router_args, log_dir=log_dir, startup_timeout_s=startup_timeout,
        )  # fmt: skip
        try:
            rounds = measure_cold_starts(
                lambda: start_fleet(**fleet_args), lambda f: f.processes(), lambda f: f.stop(), measure_launches
            )
        except TargetError as e:
            raise FleetUsageError(str(e)) from None
        print(format_cold_starts(rounds), flush=True)
        return
    try:
        code = serve_fleet(
            echo=lambda line: print(line, flush=True),
            replicas=replicas, engine=engine, profile=profile, time_scale=time_scale, seed=seed,
            router=router, router_port=router_port, router_args=router_args, log_dir=log_dir,
            startup_timeout_s=startup_timeout,
        )  # fmt: skip
    except TargetError as e:
        raise FleetUsageError(str(e)) from None
    sys.exit(code)
