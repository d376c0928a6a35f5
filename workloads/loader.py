"""``load_workload``: one entry point for a shipped spec name, a YAML spec path or a session file."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from workloads.errors import WorkloadError
from workloads.sessions_jsonl import load_sessions_jsonl
from workloads.spec import load_spec
from workloads.synthetic import SyntheticWorkload
from workloads.workload import Workload

SPEC_SUFFIXES = (".yaml", ".yml")
SESSION_SUFFIXES = (".jsonl",)


def _specs_dir() -> Path:
    return Path(str(resources.files("workloads") / "specs"))


def shipped_workloads() -> list[str]:
    """Names of the specs shipped in ``workloads/specs/``, sorted."""
    return sorted(p.stem for p in _specs_dir().glob("*.yaml"))


def load_workload(name_or_path: str | Path) -> Workload:
    """A shipped spec by name (``agentic-coding``), a ``.yaml``/``.yml`` spec, or a ``.jsonl`` session file.

    Raises :class:`WorkloadError` (one line) for an unknown name, an unreadable file or invalid content.
    """
    text = str(name_or_path)
    suffix = Path(text).suffix.lower()
    if suffix in SPEC_SUFFIXES:
        return SyntheticWorkload(load_spec(text), source=text)
    if suffix in SESSION_SUFFIXES:
        return load_sessions_jsonl(text)
    shipped = shipped_workloads()
    if text in shipped:
        spec = load_spec(_specs_dir() / f"{text}.yaml", label=f"{text}.yaml")
        return SyntheticWorkload(spec, source=text)
    raise WorkloadError(
        f"unknown workload {text!r}; use one of {', '.join(shipped)}, a .yaml/.yml spec path or a .jsonl "
        "session file"
    )
