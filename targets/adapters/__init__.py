"""Target adapters: one per API flavour; each builds a request and parses one stream line.

Built-in adapters register in the ``loadgen.targets`` entry-point group (see ``targets.registry``);
third-party packages add theirs the same way.
"""

from .base import (
    Adapter,
    BadChunk,
    ChatRequest,
    PreparedRequest,
    StreamEvent,
    StreamParser,
    Usage,
)

__all__ = [
    "Adapter",
    "BadChunk",
    "ChatRequest",
    "PreparedRequest",
    "StreamEvent",
    "StreamParser",
    "Usage",
]
