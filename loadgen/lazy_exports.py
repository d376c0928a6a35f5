"""A package's public names, loaded on first use: the ``__getattr__`` every loadgen package uses.

Importing one module of a package must not import the others (the engine would load the
runtime's Locust, ``loadgen --help`` every command), so each package's ``__init__`` lists its
names and where they live, and this loads a name's module the first time it is asked for.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from typing import Any


def lazy_getattr(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``exports`` maps each name to its submodule."""

    def __getattr__(name: str) -> Any:
        if name in exports:
            return getattr(import_module(f"{package}.{exports[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__


__all__ = ["lazy_getattr"]
