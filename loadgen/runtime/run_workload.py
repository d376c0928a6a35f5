"""The workload of a run: load it from a ``RunConfig`` (master or worker), and ship its file to workers.

A data file travels inside the plan (``RunConfig.workload_text``) so a worker on another machine
needs no copy; files over ``MAX_SHIPPED_BYTES`` do not (a ZeroMQ message that large stalls the
master), and such a worker reads the same path on its own disk.
"""

from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path
from typing import Any

from loadgen.config import RunConfig
from loadgen.errors import UserError
from workloads.loader import is_streamed_file
from workloads.streamed import STREAM_MIN_BYTES

MAX_SHIPPED_BYTES = 64 * 1024 * 1024
FILE_SUFFIXES = (".yaml", ".yml", ".jsonl", ".json", ".csv", ".gz", ".gzip", ".zst", ".zstd")


def parse_options_flag(text: str) -> dict[str, str]:
    """``--workload-options`` as a dict; a one-line ``WorkloadError`` for a malformed item."""
    from workloads.readers import parse_workload_options

    return parse_workload_options(text)


def workload_file_text(workload: str) -> str | None:
    """The content to ship for a file workload (None for a shipped spec name or a file too large)."""
    p = Path(workload)
    if not (p.suffix.lower() in FILE_SUFFIXES or p.is_file()):
        return None
    if not p.is_file():
        raise UserError(f"--workload {workload}: no such file")
    if p.stat().st_size > MAX_SHIPPED_BYTES or is_streamed_file(p):
        # A streamed trace never travels as one message: a worker reads it at the same path.
        return None
    # A gzip/zstd file (told by content) ships decompressed, so the worker needs no decompressor;
    # decompressed past the limit, the worker reads the same path, like any large file.
    from workloads.compressed import compression, read_bytes
    from workloads.errors import WorkloadError

    try:
        data = read_bytes(p) if compression(p) else p.read_bytes()
    except WorkloadError as e:
        raise UserError(f"--workload: {e}") from None
    if len(data) > MAX_SHIPPED_BYTES:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"--workload {workload}: not UTF-8 text; workload files are UTF-8") from None


def tokenizer_file_text(name_or_path: str) -> str | None:
    """The tokenizer.json content to ship to workers (None when it is too large to ship)."""
    from workloads.hf_tokenizer import resolve_tokenizer_file

    path = resolve_tokenizer_file(name_or_path)
    if path.stat().st_size > MAX_SHIPPED_BYTES:
        return None
    return path.read_text(encoding="utf-8")


def load_tokenizer(name_or_path: str | None, json_text: str | None = None) -> Any:
    """The run's tokenizer: loadgen's built-in one, or ``--tokenizer`` (from shipped text on a worker)."""
    from workloads.hf_tokenizer import load_hf_tokenizer
    from workloads.text import BUILTIN

    if not name_or_path:
        return BUILTIN
    here = json_text is None or Path(name_or_path).exists()
    return load_hf_tokenizer(name_or_path, json_text=None if here else json_text)


def load_workload_named(
    workload: str,
    fmt: str | None = None,
    options: dict[str, str] | None = None,
    tokenizer: str | None = None,
    tokenizer_json: str | None = None,
    stream: bool = False,
) -> Any:
    """``workloads.load_workload`` with a one-line ``UserError`` naming the flag. ``stream``: a large
    trace is replayed as it is read (``workloads.streamed``), as a run does.

    The master reads the workload three times at start (options, validation, run.json): a large
    dataset is parsed once per process and file version, keyed by path, size and mtime.
    """
    return _load_once(
        workload, fmt, tuple(sorted((options or {}).items())), tokenizer, tokenizer_json,
        _stamp(workload), _stamp(tokenizer) if tokenizer else None, stream,
    )  # fmt: skip


def _stamp(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


@functools.lru_cache(maxsize=4)
def _load_once(
    workload: str,
    fmt: str | None,
    options: tuple[tuple[str, str], ...],
    tokenizer: str | None,
    tokenizer_json: str | None,
    _workload_stamp: tuple[int, int] | None,
    _tokenizer_stamp: tuple[int, int] | None,
    stream: bool = False,
) -> Any:
    from workloads import load_workload
    from workloads.errors import WorkloadError

    tok = load_tokenizer(tokenizer, tokenizer_json)
    try:
        return load_workload(workload, fmt=fmt, options=dict(options), tokenizer=tok, stream=stream)
    except WorkloadError as e:
        raise UserError(f"--workload: {e}") from None


def has_timestamps(workload: str, fmt: str | None, options: dict[str, str], tokenizer: str | None = None) -> bool:
    """Whether the workload carries its own arrival times (a trace, a session file with arrival_s)."""
    return load_workload_named(workload, fmt, options, tokenizer, stream=True).has_arrival_times()


def config_workload(cfg: RunConfig) -> Any:
    """The run's workload here: the shipped file content when the path does not exist on this host."""
    if cfg.workload_text is not None and not os.path.exists(cfg.workload):
        suffix = os.path.splitext(cfg.workload)[1]
        d = tempfile.mkdtemp(prefix="loadgen-workload-")
        path = os.path.join(d, os.path.basename(cfg.workload) or f"workload{suffix}")
        with open(path, "w", encoding="utf-8") as f:
            f.write(cfg.workload_text)
        return load_workload_named(
            path, cfg.workload_format, cfg.workload_options, cfg.tokenizer, cfg.tokenizer_json, stream=True
        )
    if not os.path.exists(cfg.workload) and Path(cfg.workload).suffix.lower() in FILE_SUFFIXES:
        raise UserError(
            f"--workload {cfg.workload}: not on this host and too large to ship (over "
            f"{MAX_SHIPPED_BYTES // 2**20} MiB, or a trace of {STREAM_MIN_BYTES // 2**20} MiB or more, which "
            "is streamed); copy it to the same path on every worker"
        )
    return load_workload_named(
        cfg.workload, cfg.workload_format, cfg.workload_options, cfg.tokenizer, cfg.tokenizer_json, stream=True
    )
