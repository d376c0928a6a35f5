"""``loadgen capture``: a forwarding proxy that records live agent traffic as a session file.

Two processes. The relay only moves bytes: ``proxy`` (the aiohttp server, on uvloop),
``upstream`` (its kept-alive connections to the server, relaying a reply piece by piece), ``feed``
(each recorded exchange as events, sent in batches over a pipe), ``service`` (flags, serving,
starting the other process). The assembler process (``assembler_process``) parses and records:
``recorder`` (events into turns), ``apis`` (which requests are recorded, and the Messages and
Responses bodies as chat-shaped messages), ``messages`` (what a chat request says), ``assembly``
(requests into sessions, pure), ``conversations`` (the turns, conversations and pending requests
it keeps, and the history-prefix matching), ``subagents`` (sub-agents as fan-out), ``reply`` (a reply's
output length and, for Responses, its id), ``redact`` (same-shape filler), ``anonymized`` (block
hashes instead of text), ``writer`` (the crash-safe session file). docs/workloads.md "Capturing live traffic" is the
user's guide."""

from __future__ import annotations

from loadgen.lazy_exports import lazy_getattr

_EXPORTS = {
    "CaptureOptions": "service",
    "CaptureStats": "conversations",
    "SessionAssembler": "assembly",
    "run_capture": "service",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_getattr(__name__, _EXPORTS)
