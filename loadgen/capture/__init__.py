"""``loadgen capture``: a forwarding proxy that records live agent traffic as a session file.

Modules: ``messages`` (what a chat request says), ``assembly`` (requests into sessions, pure),
``reply`` (a reply's output length, read on the side), ``redact`` (same-shape filler),
``writer`` (the crash-safe session file), ``proxy`` (the aiohttp server), ``upstream`` (its
kept-alive connections to the server, relaying a reply piece by piece), ``service`` (flags,
serving, periodic writes). docs/workloads.md "Capturing live traffic" is the user's guide.
"""

from loadgen.capture.assembly import CaptureStats, SessionAssembler
from loadgen.capture.redact import redact
from loadgen.capture.service import CaptureOptions, run_capture

__all__ = ["CaptureOptions", "CaptureStats", "SessionAssembler", "redact", "run_capture"]
