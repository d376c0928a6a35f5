"""Find adapters by name through the ``loadgen.targets`` entry-point group.

Built-in adapters are declared in ``pyproject.toml``; a third-party package adds its own with::

    [project.entry-points."loadgen.targets"]
    my-api = "my_package.adapter:MyAdapter"

``get_adapter("openai-chat", continuous_usage_stats=True)`` loads the class and constructs it with
the options given. Unknown names and unknown options raise ``TargetError`` with the installed
names or the accepted options in the message.
"""

from __future__ import annotations

import inspect
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from .adapters.base import Adapter
from .errors import TargetError

__all__ = ["ENTRY_POINT_GROUP", "available_adapters", "get_adapter"]

ENTRY_POINT_GROUP = "loadgen.targets"


def _entry_points() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def available_adapters() -> list[str]:
    """Names of the installed adapters, sorted."""
    return sorted(_entry_points())


def get_adapter(name: str, **options: Any) -> Adapter:
    """A new adapter ``name`` constructed with ``options``.

    Raises ``TargetError`` for an unknown name, an adapter that fails to load, or an option the
    adapter does not take.
    """
    eps = _entry_points()
    ep = eps.get(name)
    if ep is None:
        installed = ", ".join(sorted(eps)) or "none"
        raise TargetError(f"unknown target adapter {name!r}; installed adapters: {installed}")
    try:
        cls = ep.load()
    except Exception as e:  # an installed plug-in that is broken
        raise TargetError(f"target adapter {name!r} ({ep.value}) failed to load: {e}") from e
    if not (isinstance(cls, type) and issubclass(cls, Adapter)):
        raise TargetError(f"target adapter {name!r} ({ep.value}) is not an Adapter subclass")
    accepted = [
        p.name
        for p in inspect.signature(cls.__init__).parameters.values()
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "self"
    ]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        takes = ", ".join(accepted) or "no options"
        raise TargetError(f"target adapter {name!r} does not take option {unknown[0]!r}; it takes: {takes}")
    try:
        return cls(**options)
    except (TypeError, ValueError) as e:
        raise TargetError(f"target adapter {name!r}: {e}") from e
