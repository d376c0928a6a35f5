"""Dataset and trace readers, found by name through the ``loadgen.workloads`` entry-point group.

Built-in readers (``sessions``, ``sharegpt``, ``mooncake``, ``azure``, ``burstgpt``, ``bailian``,
``weka-trace``) are listed in ``BUILTIN_READERS`` (and declared in ``pyproject.toml``), so they are
found even by an install whose metadata predates them; a third-party package adds its own format
with::

    [project.entry-points."loadgen.workloads"]
    my-format = "my_package.reader:MyReader"      # a WorkloadReader subclass

``read_workload_file(path)`` detects the format from the extension and the first record; give
``fmt`` to skip detection. docs/workloads.md describes every format and option.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any

from workloads.compressed import data_suffix
from workloads.errors import WorkloadError
from workloads.readers.base import WorkloadReader, iter_json_array, open_text, parse_workload_options
from workloads.text import BUILTIN, TextTokenizer
from workloads.workload import Workload

__all__ = [
    "ENTRY_POINT_GROUP",
    "WorkloadReader",
    "available_readers",
    "detect_format",
    "get_reader",
    "parse_workload_options",
    "read_workload_file",
]

ENTRY_POINT_GROUP = "loadgen.workloads"
# When no reader recognises the first record, the reader that owns the extension reads the file and
# names what is wrong with it (a session file whose first line is broken is still a session file).
DEFAULT_FOR_SUFFIX = {".jsonl": "sessions", ".json": "sharegpt", ".csv": "azure"}


BUILTIN_READERS = {
    "sessions": "workloads.readers.sessions:SessionsReader",
    "sharegpt": "workloads.readers.sharegpt:ShareGPTReader",
    "mooncake": "workloads.readers.mooncake:MooncakeReader",
    "azure": "workloads.readers.azure:AzureReader",
    "burstgpt": "workloads.readers.burstgpt:BurstGPTReader",
    "bailian": "workloads.readers.bailian:BailianReader",
    "weka-trace": "workloads.readers.weka_trace:WekaTraceReader",
}


def _entry_points() -> dict[str, EntryPoint]:
    eps = {name: EntryPoint(name, value, ENTRY_POINT_GROUP) for name, value in BUILTIN_READERS.items()}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name not in BUILTIN_READERS:  # a plug-in adds formats; the built-in names stay built in
            eps[ep.name] = ep
    return eps


def available_readers() -> list[str]:
    """Names of the installed readers, sorted."""
    return sorted(_entry_points())


def get_reader(name: str) -> WorkloadReader:
    """A new reader for format ``name``; a one-line ``WorkloadError`` for an unknown or broken one."""
    eps = _entry_points()
    ep = eps.get(name)
    if ep is None:
        installed = ", ".join(sorted(eps)) or "none (reinstall loadgen: pip install -e .)"
        raise WorkloadError(f"unknown workload format {name!r}; installed formats: {installed}")
    try:
        cls = ep.load()
    except Exception as e:  # an installed plug-in that is broken
        raise WorkloadError(f"workload format {name!r} ({ep.value}) failed to load: {e}") from e
    if not (isinstance(cls, type) and issubclass(cls, WorkloadReader)):
        raise WorkloadError(f"workload format {name!r} ({ep.value}) is not a WorkloadReader subclass")
    return cls()


def _first_record(path: Path) -> Any:
    """The first JSON element/line or the CSV header of ``path``, or None when it is neither."""
    text = open_text(path, "workload file")
    head = text.lstrip()
    if head.startswith("["):
        try:
            first = next(iter_json_array(path, text), None)
        except WorkloadError:
            return None
        return None if first is None else first[1]  # (line, element)
    if head.startswith("{"):
        line = head.split("\n", 1)[0]
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            pass
        if data_suffix(path) != ".json":
            return None
        try:  # a .json file holding one pretty-printed object (a WekaTrace trace file)
            return json.JSONDecoder().raw_decode(head)[0]
        except json.JSONDecodeError:
            return None
    return next(csv.reader(io.StringIO(head)), None)


def detect_format(path: str | Path) -> str:
    """The installed reader whose format ``path`` is in, from its extension and its first record."""
    path = Path(path)
    first = _first_record(path)
    suffix = data_suffix(path)  # data.json.gz is a .json file
    names = available_readers()
    for name in names:
        reader = get_reader(name)
        if suffix in reader.suffixes and reader.sniff(path, first):
            return name
    for name in names:
        if get_reader(name).sniff(path, first):
            return name
    if DEFAULT_FOR_SUFFIX.get(suffix) in names:
        return DEFAULT_FOR_SUFFIX[suffix]
    raise WorkloadError(
        f"{path}: cannot tell its format from the first record; name it with --workload-format "
        f"(one of {', '.join(names)})"
    )


def read_workload_file(
    path: str | Path,
    fmt: str | None = None,
    options: str | Mapping[str, Any] | None = None,
    *,
    tokenizer: TextTokenizer = BUILTIN,
) -> Workload:
    """Read ``path`` in format ``fmt`` (detected when None) with reader ``options``."""
    path = Path(path)
    if not path.is_file():
        raise WorkloadError(f"{path}: no such file; give the path of a dataset, trace or session file")
    name = fmt or detect_format(path)
    return get_reader(name).read(path, parse_workload_options(options), tokenizer=tokenizer)
