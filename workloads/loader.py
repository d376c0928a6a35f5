"""``load_workload``: one entry point for a shipped spec name, a YAML spec, or a data file.

Data files are session files, datasets and traces (``workloads.readers``): the format is detected
from the extension and first record unless ``fmt`` names it, and ``options`` go to its reader.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from workloads.compressed import data_suffix
from workloads.errors import WorkloadError
from workloads.readers import available_readers, get_reader, parse_workload_options, read_workload_file
from workloads.readers.stream import first_line, iter_json_array_blocks, iter_text_blocks
from workloads.spec import load_spec
from workloads.streamed import STREAM_MIN_BYTES, StreamedTraceWorkload, should_stream
from workloads.synthetic import SyntheticWorkload
from workloads.text import BUILTIN, TextTokenizer
from workloads.workload import Workload

SPEC_SUFFIXES = (".yaml", ".yml")
DATA_SUFFIXES = (".jsonl", ".json", ".csv")


def _specs_dir() -> Path:
    return Path(str(resources.files("workloads") / "specs"))


def shipped_workloads() -> list[str]:
    """Names of the specs shipped in ``workloads/specs/``, sorted."""
    return sorted(p.stem for p in _specs_dir().glob("*.yaml"))


def load_workload(
    name_or_path: str | Path,
    *,
    fmt: str | None = None,
    options: str | Mapping[str, Any] | None = None,
    tokenizer: TextTokenizer = BUILTIN,
    stream: bool = False,
) -> Workload:
    """A shipped spec by name (``agentic-coding``), a ``.yaml``/``.yml`` spec, or a data file.

    Data files: a session file (``.jsonl``), a ShareGPT-style dataset (``.json``/``.jsonl``), a
    Mooncake or Qwen-Bailian trace (``.jsonl``), an Azure or BurstGPT trace (``.csv``), or any
    format named by ``fmt``. With ``stream``, a large trace whose reader iterates its rows is
    replayed as it is read (``workloads.streamed``), not read whole.
    Raises :class:`WorkloadError` (one line) for an unknown name, an unreadable file or invalid content.
    """
    text = str(name_or_path)
    suffix = Path(text).suffix.lower()
    if fmt:
        return _data_file(text, fmt, options, tokenizer, stream)
    if suffix in SPEC_SUFFIXES or (suffix not in DATA_SUFFIXES and text in shipped_workloads()):
        if parse_workload_options(options):
            raise WorkloadError(f"{text}: --workload-options are for data files; a spec sets its knobs in YAML")
        if suffix in SPEC_SUFFIXES:
            wl = SyntheticWorkload(load_spec(text), source=text)
        else:
            wl = SyntheticWorkload(load_spec(_specs_dir() / f"{text}.yaml", label=f"{text}.yaml"), source=text)
        wl.tokenizer = tokenizer
        return wl
    if suffix in DATA_SUFFIXES or data_suffix(text) in DATA_SUFFIXES or Path(text).is_file():
        return _data_file(text, None, options, tokenizer, stream)
    shipped = ", ".join(shipped_workloads())
    raise WorkloadError(
        f"unknown workload {text!r}; use one of {shipped}, a .yaml/.yml spec, or a data file "
        "(.jsonl session file, ShareGPT .json/.jsonl, Mooncake or Qwen-Bailian .jsonl, Azure or BurstGPT .csv)"
    )


def _data_file(
    path: str, fmt: str | None, options: str | Mapping[str, Any] | None, tokenizer: TextTokenizer, stream: bool
) -> Workload:
    if stream:
        p = Path(path)
        name = fmt or (_large_file_format(p) if p.is_file() and p.stat().st_size >= STREAM_MIN_BYTES else None)
        if name is not None:
            reader = get_reader(name)
            if should_stream(reader, p):
                return StreamedTraceWorkload(reader, p, parse_workload_options(options), tokenizer=tokenizer)
    return read_workload_file(path, fmt, options, tokenizer=tokenizer)


def is_streamed_file(path: str | Path, fmt: str | None = None) -> bool:
    """Whether a run replays ``path`` as it reads it (``load_workload(..., stream=True)``)."""
    p = Path(path)
    try:
        if p.stat().st_size < STREAM_MIN_BYTES:
            return False
        name = fmt or _large_file_format(p)
        return name is not None and should_stream(get_reader(name), p)
    except (OSError, WorkloadError):
        return False


def _large_file_format(path: Path) -> str | None:
    """The format of a large file whose reader iterates rows, told from its first line (as
    ``detect_format`` tells it, without reading the file whole); None: leave it to ``detect_format``."""
    line = first_line(path, "workload file").strip()
    if line.startswith("["):
        try:
            first: Any = next(iter_json_array_blocks(path, iter_text_blocks(path, "workload file")), (0, None))[1]
        except WorkloadError:
            return None
    elif line.startswith("{"):
        try:
            first = json.loads(line)
        except json.JSONDecodeError:
            return None
    elif line:
        first = next(csv.reader([line]), None)
    else:
        return None
    suffix = data_suffix(path)
    readers = [(name, get_reader(name)) for name in available_readers()]
    for name, reader in [*((n, r) for n, r in readers if suffix in r.suffixes), *readers]:
        if reader.sniff(path, first):
            return name if reader.streams_rows else None
    return None
