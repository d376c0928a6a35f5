"""``python -m targets.sim`` / ``loadgen serve sim``: start one simulated engine.

Declares the click command only; the server lives in ``server.py``. On start it prints one line,
``loadgen-sim listening on http://127.0.0.1:PORT (profile NAME, time-scale S)``, and flushes, so a
launcher can read the port when it asked for port 0. SIGTERM or SIGINT stop it cleanly (exit 0).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import signal
import sys

import click

from targets.quiet_gc import quiet_gc
from targets.sim.answers import AnswersError, load_answers
from targets.sim.faults import FaultConfig
from targets.sim.profile import Profile, ProfileError, profile_names, resolve_profile
from targets.sim.server import EngineCrashed, SimConfig, SimServer, serve
from targets.sim.tool_calls import ToolCalls

LISTENING_PREFIX = "loadgen-sim listening on "
_PROBABILITY = click.FloatRange(0.0, 1.0)


class SimError(click.ClickException):
    """A one-line error the user can fix (port taken, log not writable); exit code 2."""

    exit_code = 2


def _finite_non_negative(_ctx: click.Context, param: click.Parameter, value: float) -> float:
    if not math.isfinite(value) or value < 0:
        raise click.BadParameter(f"{value} is not a finite number >= 0", param=param)
    return value


def _known_profile(_ctx: click.Context, param: click.Parameter, value: str) -> Profile:
    try:
        return resolve_profile(value)
    except ProfileError as e:
        raise click.BadParameter(str(e), param=param) from None


def _eos_lengths(_ctx: click.Context, param: click.Parameter, value: str | None):
    """A JSON distribution for ``eos_lengths``, checked as a profile's would be."""
    if value is None:
        return None
    import orjson

    from targets.sim.profile import parse_eos_lengths

    try:
        raw = orjson.loads(value)
    except orjson.JSONDecodeError:
        raise click.BadParameter(
            f"{value!r} is not JSON; use e.g. '{{\"dist\": \"lognormal\", \"median\": 120, \"sigma\": 0.8}}'",
            param=param,
        ) from None
    try:
        return parse_eos_lengths(raw, "--eos-lengths")
    except ProfileError as e:
        raise click.BadParameter(str(e).removeprefix("--eos-lengths: eos_lengths: "), param=param) from None


def _tool_calls(_ctx: click.Context, param: click.Parameter, value: str | None):
    """A JSON object for ``tool_calls``, checked as a profile's would be."""
    if value is None:
        return None
    import orjson

    from targets.sim.tool_calls import ToolCallsError, parse_tool_calls

    try:
        raw = orjson.loads(value)
    except orjson.JSONDecodeError:
        raise click.BadParameter(f"{value!r} is not JSON; use e.g. '{{\"fraction\": 0.5, \"tool\": \"run_tests\"}}'",
                                 param=param) from None  # fmt: skip
    try:
        return parse_tool_calls(raw, "--tool-calls")
    except ToolCallsError as e:
        raise click.BadParameter(str(e).removeprefix("--tool-calls: tool_calls").lstrip(":. "), param=param) from None


@click.command(
    "sim",
    help="Start a simulated LLM inference engine (OpenAI-compatible, streaming) on 127.0.0.1.",
    context_settings={"max_content_width": 100},
)
@click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True, help="TCP port; 0 picks a free one.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option(
    "--profile",
    "profile_name",
    required=True,
    callback=_known_profile,
    help=f"Hardware/model profile: {', '.join(profile_names())}, or a profile file (.json).",
)
@click.option(
    "--time-scale",
    type=float,
    default=1.0,
    show_default=True,
    callback=_finite_non_negative,
    help="Wall seconds per simulated second; 0 runs as fast as possible.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the replies and of fault draws.")
@click.option("--model-name", default=None, help="Model id served (default: the profile's).")
@click.option("--server-id", default=None, help="Id in truth records and /sim/info (default: sim-PORT).")
@click.option("--fault-http-500", type=_PROBABILITY, default=0.0, help="Probability of a 500 before streaming.")
@click.option("--fault-http-429", type=_PROBABILITY, default=0.0, help="Probability of a 429 before streaming.")
@click.option("--fault-stall", type=_PROBABILITY, default=0.0, help="Probability of a mid-stream stall.")
@click.option("--stall-s", type=float, default=2.0, show_default=True, callback=_finite_non_negative,
              help="Length of a stall, wall seconds.")
@click.option("--fault-cut", type=_PROBABILITY, default=0.0, help="Probability of closing the connection mid-stream.")
@click.option("--fault-malformed", type=_PROBABILITY, default=0.0, help="Probability of one non-JSON chunk mid-stream.")
@click.option("--truth-log", type=click.Path(dir_okay=False), default=None,
              help="Append one JSON line per finished request to this file.")
@click.option("--answers", "answers_file", type=click.Path(dir_okay=False), default=None,
              help="JSONL of {prompt, answer} (a quality eval file): reply to a known prompt with its answer.")
@click.option("--wrong-answers", is_flag=True, help="Reply to every known prompt of --answers wrongly.")
@click.option("--reasoning-tokens", type=click.IntRange(min=0), default=None, metavar="N",
              help="Open every chat, Messages and Responses reply with N reasoning tokens; default: the profile's.")
@click.option("--eos-lengths", "eos_lengths", default=None, metavar="JSON", callback=_eos_lengths,
              help='Natural reply lengths, e.g. \'{"dist": "lognormal", "median": 120, "sigma": 0.8}\': replies '
                   "end with stop at a drawn length below max_tokens; default: the profile's.")
@click.option("--tool-calls", "tool_calls", default=None, metavar="JSON", callback=_tool_calls,
              help='Tool-call replies, e.g. \'{"fraction": 0.5, "tool": "run_tests"}\': that share of replies to '
                   "requests that offer tools call one, with the reply's tokens as arguments; default: the profile's.")
@click.option("--preemption/--no-preemption", default=None,
              help="KV blocks on demand, preempting the newest request under pressure; default: the profile's.")
@click.option("--measure-cold-start", "measure_launches", type=click.IntRange(min=1), default=None, metavar="N",
              help="Launch a sim N times (launch -> listening -> healthy -> first token), print p50/max, exit.")
def sim_command(
    port: int,
    host: str,
    profile_name: Profile,
    time_scale: float,
    seed: int,
    model_name: str | None,
    server_id: str | None,
    fault_http_500: float,
    fault_http_429: float,
    fault_stall: float,
    stall_s: float,
    fault_cut: float,
    fault_malformed: float,
    truth_log: str | None,
    answers_file: str | None,
    wrong_answers: bool,
    reasoning_tokens: int | None,
    eos_lengths: dict | None,
    tool_calls: ToolCalls | None,
    preemption: bool | None,
    measure_launches: int | None,
) -> None:
    if reasoning_tokens is not None:
        profile_name = dataclasses.replace(profile_name, reasoning_tokens=reasoning_tokens)
    if eos_lengths is not None:
        profile_name = dataclasses.replace(profile_name, eos_lengths=eos_lengths)
    if tool_calls is not None:
        profile_name = dataclasses.replace(profile_name, tool_calls=tool_calls)
    if preemption is not None:
        profile_name = dataclasses.replace(profile_name, preemption=preemption)
    if wrong_answers and not answers_file:
        raise click.UsageError("--wrong-answers needs --answers FILE")
    if measure_launches:
        _measure_cold_start(measure_launches, profile_name, time_scale, seed, answers_file)
        return
    config = SimConfig(
        profile=profile_name,
        time_scale=time_scale,
        seed=seed,
        model_name=model_name,
        server_id=server_id,
        faults=FaultConfig(
            http_500=fault_http_500,
            http_429=fault_http_429,
            cut=fault_cut,
            stall=fault_stall,
            malformed=fault_malformed,
            stall_s=stall_s,
        ),
        truth_log=truth_log,
        answers=_answers(answers_file),
        wrong_answers=wrong_answers,
    )
    run_sim(config, host, port)


def _answers(path: str | None) -> dict[str, str] | None:
    if path is None:
        return None
    try:
        return load_answers(path)
    except AnswersError as e:
        raise SimError(str(e)) from None


def _measure_cold_start(
    launches: int, profile: Profile, time_scale: float, seed: int, answers_file: str | None
) -> None:
    """Start a sim child process ``launches`` times and print how long each phase took."""
    from targets.errors import TargetError
    from targets.fleet import start_fleet  # the fleet imports the sim: not at module level
    from targets.fleet.coldstart import format_cold_starts, measure_cold_starts

    if profile.name not in profile_names():
        raise SimError(f"--measure-cold-start needs a shipped profile ({', '.join(profile_names())})")
    _answers(answers_file)  # a bad file fails once, here, not in every child
    sim_args = ["--answers", answers_file] if answers_file else []

    def launch():
        return start_fleet(
            replicas=1, engine="sim", profile=profile.name, time_scale=time_scale, seed=seed, router="none",
            sim_args=sim_args,
        )  # fmt: skip

    try:
        rounds = measure_cold_starts(launch, lambda f: f.processes(), lambda f: f.stop(), launches)
    except TargetError as e:
        raise SimError(str(e)) from None
    click.echo(format_cold_starts(rounds))


def run_sim(config: SimConfig, host: str, port: int) -> None:
    """Serve until SIGTERM/SIGINT; print the listening line once bound."""
    try:
        asyncio.run(_main(config, host, port))
    except OSError as e:
        raise SimError(f"cannot start the sim on {host}:{port}: {e.strerror or e}") from None
    except EngineCrashed as e:
        raise click.ClickException(str(e)) from e


async def _main(config: SimConfig, host: str, port: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    def announce(server: SimServer) -> None:
        quiet_gc()
        shown = f"[{host}]" if ":" in host else host
        sys.stdout.write(
            f"{LISTENING_PREFIX}http://{shown}:{server.port} "
            f"(profile {config.profile.name}, time-scale {config.time_scale:g})\n"
        )
        sys.stdout.flush()

    await serve(config, host, port, stop, announce)
