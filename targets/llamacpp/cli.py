"""``loadgen serve llama-server``: N local llama-server replicas, up until Ctrl-C or SIGTERM.

    loadgen serve llama-server --model smollm2 --replicas 2 --parallel 2 --ctx 4096 --threads 1

prints one URL a line on stdout (replica 0 first) once every replica answers ``/health``, a
one-line summary on stderr, and keeps them up until SIGINT or SIGTERM; then it stops them all.
The replicas are owned children (``targets.fleet.procs``): killed even when this process is
killed with SIGKILL, so no server is left on a port.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from targets.errors import TargetError
from targets.fleet.coldstart import format_cold_starts, measure_cold_starts
from targets.llamacpp.launcher import LlamaServerError, ensure_llama_server, start_llama_servers

__all__ = ["SMOLLM2", "llama_server_command", "resolve_model", "serve_llama_servers"]

SMOLLM2 = "smollm2"


class ServeError(click.ClickException):
    """Replicas that cannot start as asked: ``Error: <message>`` on one line, exit 2."""

    exit_code = 2


def resolve_model(model: str) -> tuple[Path, Path]:
    """``(binary, model)`` for ``--model``: ``smollm2`` is the cached SmolLM2-135M, else a GGUF path.

    The binary is the cached build (or ``LLAMA_SERVER_BIN``); nothing is built or downloaded.
    Raises a one-line :class:`LlamaServerError`.
    """
    if model.lower() == SMOLLM2:
        return ensure_llama_server()
    path = Path(model).expanduser()
    if not path.is_file():
        raise LlamaServerError(f"--model {model}: no such file; give a .gguf file or '{SMOLLM2}'")
    with _environ("LLAMA_SERVER_MODEL", str(path.resolve())):
        return ensure_llama_server()


@contextmanager
def _environ(name: str, value: str) -> Iterator[None]:
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def serve_llama_servers(
    *,
    model: str,
    replicas: int,
    echo: Callable[[str], None] = print,
    note: Callable[[str], None] | None = None,
    poll_s: float = 0.5,
    **start_args: Any,
) -> int:
    """Start the replicas, announce them, keep them up until SIGINT or SIGTERM, stop them.

    ``echo`` gets one URL per line; ``note`` (default: stderr) a one-line summary. ``start_args``
    go to :func:`start_llama_servers`. Returns the exit code: 0 after a signal (also one that
    arrives while starting: what started is stopped), 1 when a replica died while serving (its log
    tail is shown). A replica that cannot start raises a one-line ``TargetError``.
    """
    note = note or (lambda line: print(line, file=sys.stderr, flush=True))
    binary, model_path = resolve_model(model)
    stop_requested = threading.Event()

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt  # while starting: start_llama_servers stops what it started

    previous = {s: signal.signal(s, interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            fleet = start_llama_servers(replicas, binary=binary, model_path=model_path, **start_args)
        except KeyboardInterrupt:
            return 0
        for s in previous:
            signal.signal(s, lambda *_: stop_requested.set())
        try:
            for url in fleet.urls:
                echo(url)
            argv = fleet[0].argv
            shape = ", ".join(f"{flag.lstrip('-')} {argv[argv.index(flag) + 1]}" for flag in
                              ("--parallel", "--ctx-size", "--threads"))  # fmt: skip
            logs = f"{fleet[0].log_path.parent}{' (removed on exit)' if fleet.owned_log_dir else ''}"
            note(
                f"llama-server ready: {len(fleet)} replica{'s' if len(fleet) != 1 else ''} of "
                f"{model_path.name} ({shape} each); logs in {logs}; Ctrl-C stops it"
            )
            while not stop_requested.wait(poll_s):
                dead = next((r for r in fleet if not r.alive()), None)
                if dead is not None:
                    note(f"Error: {dead.owned.describe_exit()}")
                    return 1
            return 0
        finally:
            fleet.stop()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@click.command("llama-server")
@click.option(
    "--model", default=SMOLLM2, show_default=True,
    help=f"A .gguf file, or '{SMOLLM2}' for the cached SmolLM2-135M (scripts/llama-server.sh ensure).",
)  # fmt: skip
@click.option("--replicas", type=click.IntRange(min=1), default=1, show_default=True)
@click.option(
    "--parallel", type=click.IntRange(min=1), default=1, show_default=True, help="Slots per replica."
)
@click.option(
    "--ctx", type=click.IntRange(min=1), default=2048, show_default=True,
    help="KV cache tokens per replica, shared by its slots.",
)  # fmt: skip
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    default=None,
    help="CPU threads per replica [default: cores // replicas].",
)
@click.option(
    "--port-base", type=click.IntRange(1, 65535), default=None,
    help="Replica i listens on PORT_BASE + i [default: free ports].",
)  # fmt: skip
@click.option("--alias", default=None, help="Model id the replicas report [default: the model path].")
@click.option(
    "--llama-arg", "llama_args", multiple=True, metavar="FLAG",
    help="Extra llama-server flag, repeatable; e.g. --llama-arg=--kv-unified.",
)  # fmt: skip
@click.option(
    "--log-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
    help="Where replica logs go [default: a temporary directory, removed on exit].",
)  # fmt: skip
@click.option("--ready-timeout", type=click.FloatRange(min=0, min_open=True), default=120.0, show_default=True,
              help="Seconds all replicas get to answer /health.")  # fmt: skip
@click.option("--measure-cold-start", "measure_launches", type=click.IntRange(min=1), default=None, metavar="N",
              help="Launch the replicas N times (launch -> listening -> healthy -> first token), print p50/max, exit.")  # fmt: skip
def llama_server_command(
    model, replicas, parallel, ctx, threads, port_base, alias, llama_args, log_dir, ready_timeout, measure_launches
):
    """Start llama-server replicas on 127.0.0.1 and print their URLs; Ctrl-C or SIGTERM stops them."""
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
    start_args = dict(
        parallel=parallel, ctx=ctx, threads=threads, port_base=port_base, alias=alias, extra_args=llama_args,
        log_dir=log_dir, ready_timeout=ready_timeout,
    )  # fmt: skip
    if measure_launches:
        try:
            binary, model_path = resolve_model(model)
            rounds = measure_cold_starts(
                lambda: start_llama_servers(replicas, binary=binary, model_path=model_path, **start_args),
                lambda fleet: [r.owned for r in fleet],
                lambda fleet: fleet.stop(),
                measure_launches,
            )
        except TargetError as e:
            raise ServeError(str(e)) from None
        print(format_cold_starts(rounds), flush=True)
        return
    try:
        code = serve_llama_servers(
            model=model, replicas=replicas, echo=lambda line: print(line, flush=True), **start_args
        )
    except TargetError as e:
        raise ServeError(str(e)) from None
    sys.exit(code)
