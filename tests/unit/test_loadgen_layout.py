"""The shape of the code: which package and which wing of ``loadgen`` may import which.

The rule (docs/architecture.md): packages import down, analysis ← workloads ← targets ← loadgen;
inside ``loadgen`` the wings import down, commands → runtime → live → engine → the ground
(config, errors, option parsers), with the capture tool beside them on the ground. Function-level
imports count (they are how a cycle hides); imports under ``if TYPE_CHECKING:`` do not (they never
run). A failure names the module, the import and the rule it breaks.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("analysis", "workloads", "targets", "loadgen")
# May import (besides itself): the packages a package stands on.
PACKAGE_BELOW = {
    "analysis": set(),
    "workloads": {"analysis"},
    "targets": {"workloads", "analysis"},
    "loadgen": {"targets", "workloads", "analysis"},
}
GROUND = {"loadgen", "loadgen.config", "loadgen.errors", "loadgen.adapter_options", "loadgen.target_file", "loadgen.lazy_exports"}
FACE = {"loadgen.cli", "loadgen.__main__", "loadgen.locustfile"}
WINGS = ("engine", "live", "runtime", "capture", "commands")
WING_BELOW = {
    "ground": {"ground"},
    "engine": {"ground", "engine"},
    "live": {"ground", "engine", "live"},
    "runtime": {"ground", "engine", "live", "runtime"},
    "capture": {"ground", "capture"},
    "commands": {"ground", "engine", "live", "runtime", "capture", "commands"},
    "locustfile": {"ground", "runtime"},
    "cli": {"ground", "cli", "engine", "runtime", "capture", "commands"},
}


def module_name(path: Path) -> str:
    name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return name.removesuffix(".__init__")


MODULES = {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def resolve(name: str) -> str | None:
    """The module of ours an import names (``a.b.c`` may be module ``a.b`` with attribute ``c``)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, module of ours) for every import that runs, at any depth."""
    tree = ast.parse(path.read_text())
    typing_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    out = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names]
        for n in names:
            if n.split(".")[0] in PACKAGES and (target := resolve(n)):
                out.append((node.lineno, target))
    return out


GRAPH = {m: imports_of(p) for m, p in MODULES.items()}


def wing_of(module: str) -> str:
    if module in GROUND:
        return "ground"
    if module == "loadgen.locustfile":
        return "locustfile"
    if module in FACE:
        return "cli"
    part = module.split(".")[1]
    assert part in WINGS, f"{module}: not in a wing; put it in one of loadgen/{', loadgen/'.join(WINGS)} or the ground"
    return part


def test_packages_import_down():
    for module, deps in GRAPH.items():
        pkg = module.split(".")[0]
        for line, target in deps:
            other = target.split(".")[0]
            assert other == pkg or other in PACKAGE_BELOW[pkg], (
                f"{MODULES[module].relative_to(ROOT)}:{line} imports {target}: {pkg} may import only "
                f"{sorted(PACKAGE_BELOW[pkg]) or 'itself'}"
            )


def test_the_sim_never_imports_loadgen():
    for module, deps in GRAPH.items():
        if module.startswith("targets.sim"):
            assert not [t for _, t in deps if t.startswith("loadgen")], module


def test_loadgen_wings_import_down():
    for module, deps in GRAPH.items():
        if not module.startswith("loadgen"):
            continue
        wing = wing_of(module)
        for line, target in deps:
            if not target.startswith("loadgen") or target == module:
                continue
            assert wing_of(target) in WING_BELOW[wing], (
                f"{MODULES[module].relative_to(ROOT)}:{line} imports {target}: the {wing} wing may "
                f"import only {sorted(WING_BELOW[wing])}"
            )


def test_no_import_cycles():
    edges = {m: {t for _, t in deps if t != m and not m.startswith(t + ".")} for m, deps in GRAPH.items()}
    state: dict[str, int] = {}  # 1 on the path, 2 done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for t in sorted(edges[m]):
            if state.get(t) == 1:
                cycle = [*path[path.index(t) :], t]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if t not in state:
                visit(t, [*path, t])
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m, [m])


def test_the_engine_imports_neither_locust_nor_click():
    engine = sorted(m for m in MODULES if m.startswith("loadgen.engine"))
    code = (
        "import importlib, sys\n"
        f"for m in {engine!r}: importlib.import_module(m)\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'locust', 'click', 'loadgen.runtime'}))\n"
        "print(sorted(m for m in sys.modules if m.startswith(('loadgen.runtime', 'loadgen.live', 'loadgen.commands'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.split("\n")[:2] == ["[]", "[]"], out


def test_the_cli_loads_no_command_before_one_runs():
    code = "import sys, loadgen.cli; print(sorted(m for m in sys.modules if m.startswith(('loadgen.commands.', 'locust'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "[]", out


# In a child process: loadgen.runtime imports Locust, which patches the standard library with
# gevent, and this test process must stay unpatched.
PUBLIC_NAMES_CHECK = """
import importlib, sys
from pathlib import Path
package = sys.argv[1]
pkg = importlib.import_module(package)
assert pkg.__all__ == sorted(pkg.__all__), f"{package}.__all__ is not sorted"
here = Path(pkg.__file__).parent
submodules = {p.stem for p in here.glob("*.py")} | {p.parent.name for p in here.glob("*/__init__.py")}
for name in pkg.__all__:
    assert name not in submodules, f"{package}.{name} is named like a submodule, which replaces it on import"
    value = getattr(pkg, name)
    module = importlib.import_module(f"{package}.{pkg._EXPORTS[name]}")
    assert getattr(module, name) is value, f"{package}.{name} is not {module.__name__}.{name}"
"""


@pytest.mark.parametrize("package", ["loadgen", *(f"loadgen.{w}" for w in WINGS if w != "commands")])
def test_each_package_lists_its_public_names(package):
    out = subprocess.run(
        [sys.executable, "-c", PUBLIC_NAMES_CHECK, package], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert out.returncode == 0, out.stderr[-1500:]


def test_commands_lists_its_command_modules():
    import loadgen.commands as commands

    here = Path(commands.__file__).parent
    assert commands.__all__ == sorted(p.stem for p in here.glob("*.py") if p.stem != "__init__")
