"""The public API of ``analysis``: what __all__ lists exists, and nothing of ours but analysis is imported."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import analysis

ROOT = Path(analysis.__file__).parent


def test_all_is_sorted_and_resolves():
    assert analysis.__all__ == sorted(analysis.__all__)
    for name in analysis.__all__:
        assert getattr(analysis, name) is not None, name


def test_exported_names_are_public_in_their_modules():
    for name, module in analysis._EXPORTS.items():
        mod = __import__(f"analysis.{module}", fromlist=["__all__"])
        assert name in mod.__all__, f"{name} not in analysis.{module}.__all__"
    for path in ROOT.glob("*.py"):  # every submodule imported: no export may be shadowed by one
        __import__(f"analysis.{path.stem}")
    for name, module in analysis._EXPORTS.items():
        assert getattr(analysis, name) is getattr(__import__(f"analysis.{module}", fromlist=[name]), name), (
            name
        )


def test_analysis_imports_nothing_of_ours_but_itself():
    for path in ROOT.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for n in names:
                assert n.split(".")[0] not in ("loadgen", "workloads", "targets"), f"{path.name} imports {n}"


def test_importing_records_stays_light():
    code = "import sys, analysis.records; print(sorted(m for m in sys.modules if m.startswith(('analysis', 'numpy'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['analysis', 'analysis.metric_registry', 'analysis.records']"
