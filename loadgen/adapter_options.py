"""``--adapter-options``: an adapter's constructor options from the command line.

``key=value,key=value`` (e.g. ``server_history=true`` for ``openai-responses``,
``reasoning_in_history=true`` for ``openai-chat``). A value reads as ``true``/``false`` (a bool),
``none`` (None), an integer, a number, else the text itself. The adapter checks the names: one it
does not take is a one-line error listing those it does (``targets.registry.get_adapter``).
"""

from __future__ import annotations

from typing import Any

from loadgen.errors import UserError

_WORDS: dict[str, Any] = {"true": True, "false": False, "none": None}


def parse_adapter_options(text: str) -> dict[str, Any]:
    """``--adapter-options`` as constructor keyword arguments; a one-line ``UserError`` for a
    malformed item."""
    out: dict[str, Any] = {}
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key.isidentifier():
            raise UserError(
                f"--adapter-options {item!r} is not key=value; use e.g. server_history=true (names as in docs/targets.md)"
            )
        out[key] = _value(value)
    return out


def _value(text: str) -> Any:
    low = text.lower()
    if low in _WORDS:
        return _WORDS[low]
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def checked_adapter(name: str, options: dict[str, Any]) -> Any:
    """The adapter ``name`` built with ``options``; a one-line ``UserError`` for an unknown name
    or option (before any load)."""
    from targets.registry import get_adapter

    try:
        return get_adapter(name, **options)
    except ValueError as e:  # TargetError: unknown adapter or option, listing what is accepted
        raise UserError(str(e)) from None
    except TypeError as e:  # an option of the wrong type for the constructor
        raise UserError(f"--adapter-options: {e}") from None
