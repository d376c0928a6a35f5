"""``loadgen capture``: a forwarding proxy that records live agent traffic as a session file.

Two processes. The relay only moves bytes: ``proxy`` (the aiohttp server, on uvloop),
``upstream`` (its kept-alive connections to the server, relaying a reply piece by piece), ``feed``
(each recorded exchange as events, sent in batches over a pipe), ``service`` (flags, serving,
starting the other process). The assembler process (``assembler_process``) parses and records:
``recorder`` (events into turns), ``apis`` (which requests are recorded, and the Messages and
Responses bodies as chat-shaped messages), ``messages`` (what a chat request says), ``assembly``
(requests into sessions, pure), ``subagents`` (sub-agents as fan-out), ``reply`` (a reply's
output length and, for Responses, its id), ``redact`` (same-shape filler), ``anonymized`` (block
hashes instead of text), ``writer`` (the crash-safe session file). docs/workloads.md "Capturing live traffic" is the
user's guide."""

from loadgen.capture.assembly import CaptureStats, SessionAssembler
from loadgen.capture.redact import redact
from loadgen.capture.service import CaptureOptions, run_capture

__all__ = ["CaptureOptions", "CaptureStats", "SessionAssembler", "redact", "run_capture"]
