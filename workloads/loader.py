"""``load_workload``: one entry point for a shipped spec name, a YAML spec, or a data file.

Data files are session files, datasets and traces (``workloads.readers``): the format is detected
from the extension and first record unless ``fmt`` names it, and ``options`` go to its reader.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from workloads.compressed import data_suffix
from workloads.errors import WorkloadError
from workloads.readers import parse_workload_options, read_workload_file
from workloads.spec import load_spec
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
) -> Workload:
    """A shipped spec by name (``agentic-coding``), a ``.yaml``/``.yml`` spec, or a data file.

    Data files: a session file (``.jsonl``), a ShareGPT-style dataset (``.json``/``.jsonl``), a
    Mooncake or Qwen-Bailian trace (``.jsonl``), an Azure or BurstGPT trace (``.csv``), or any
    format named by ``fmt``.
    Raises :class:`WorkloadError` (one line) for an unknown name, an unreadable file or invalid content.
    """
    text = str(name_or_path)
    suffix = Path(text).suffix.lower()
    if fmt:
        return read_workload_file(text, fmt, options, tokenizer=tokenizer)
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
        return read_workload_file(text, None, options, tokenizer=tokenizer)
    shipped = ", ".join(shipped_workloads())
    raise WorkloadError(
        f"unknown workload {text!r}; use one of {shipped}, a .yaml/.yml spec, or a data file "
        "(.jsonl session file, ShareGPT .json/.jsonl, Mooncake or Qwen-Bailian .jsonl, Azure or BurstGPT .csv)"
    )
