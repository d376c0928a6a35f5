"""An upstream reply's head (status line and headers) parsed, and the framing of the body it says.

Pure: bytes in, a ``ReplyHead`` out, or ``UpstreamError`` for a head the proxy cannot relay. The
connection (``upstream.py``) reads the body as ``ReplyHead`` frames it: ``chunked``, else
``length`` bytes (``Content-Length``; 0 for ``HEAD`` and 204/304), else to the connection's close
(``length`` -1). An interim 1xx reply parses to None: the real one follows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from multidict import CIMultiDict, CIMultiDictProxy

_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # tab is allowed in header values


class UpstreamError(Exception):
    """The upstream could not be reached or broke off; the message says how."""


@dataclass(slots=True)
class ReplyHead:
    status: int
    reason: str
    headers: CIMultiDictProxy[str]
    keep_alive: bool  # the connection may carry another request once this body has ended
    chunked: bool
    length: int  # body bytes when not chunked; -1: the body runs to the connection's close
    content_length: int | None  # what the reply says its Content-Length is, where it frames the body (or a HEAD's)


def parse_head(raw: bytes, method: str) -> ReplyHead | None:
    """The head ``raw`` (up to, not including, the blank line) of the reply to ``method``."""
    lines = raw.decode("utf-8", "surrogateescape").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    status_text, _, reason = rest.partition(" ")
    if version not in ("HTTP/1.1", "HTTP/1.0") or len(status_text) != 3 or not status_text.isdigit():
        raise UpstreamError(f"the upstream's reply is not HTTP/1.x: {lines[0][:80]!r}")
    status = int(status_text)
    if 100 <= status < 200:
        if status == 101:
            raise UpstreamError("the upstream switched protocols (101), which the proxy cannot relay")
        return None
    headers: CIMultiDict[str] = CIMultiDict()
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        # Control characters would end the client's copy of the line early (or split it).
        if not sep or not name or name != name.strip() or _CONTROL.search(line):
            raise UpstreamError(f"the upstream's reply has a malformed header line: {line[:80]!r}")
        headers.add(name, value.strip(" \t"))
    connection = headers.get("Connection", "").lower()
    keep_alive = "close" not in connection and (version == "HTTP/1.1" or "keep-alive" in connection)
    chunked = False
    left = 0
    content_length = None
    if method == "HEAD" or status in (204, 304):
        left = 0
    elif "chunked" in headers.get("Transfer-Encoding", "").lower():
        chunked = True
    elif "Content-Length" in headers:
        values = {v.strip() for v in headers.getall("Content-Length")}
        text = values.pop() if len(values) == 1 else ""
        if not text.isdigit():
            raise UpstreamError(f"the upstream's reply has a bad Content-Length: {headers['Content-Length']!r}")
        content_length = left = int(text)
    else:
        left = -1
        keep_alive = False  # the body ends with the connection
    if method == "HEAD" and "Content-Length" in headers:
        content_length = int(headers["Content-Length"]) if headers["Content-Length"].isdigit() else None
    return ReplyHead(status, reason, CIMultiDictProxy(headers), keep_alive, chunked, left, content_length)
