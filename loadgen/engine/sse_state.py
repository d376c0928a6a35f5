"""One reply's stream as it is parsed: ``StreamState`` takes the lines each ``recv`` completed,
with that ``recv``'s stamp, and keeps the token times, the text and the end (docs/metrics.md).

Its ``take`` is the per-chunk hot path: the common case (one ``data:`` line an event) is handled
inline there and its rarer shapes (an event over several ``data:`` lines, comments and fields) in
``_take_pending`` and ``_apply``, which do the same per event.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from targets.adapters.base import BadChunk, StreamEvent, Usage

if TYPE_CHECKING:
    from loadgen.engine.health import ChunkCounts

from loadgen.engine.http_reply import READER
from loadgen.engine.outcome import StreamResult

try:  # the compiled chat chunk path (loadgen/engine/_chat.c), built with the compiled reader
    from loadgen.engine import _chat
except ImportError:
    _chat = None

# Whether the compiled poller hands a compiled stream's reads to its ChatTaker in C (``raw``: no
# Python object per read) rather than through its Python-callable ``consume``: both need the
# compiled reader. LOADGEN_RAW_READS=0 keeps the callable, to compare the two.
RAW_READS = _chat is not None and _chat.HAS_READER_API and os.environ.get("LOADGEN_RAW_READS", "1") != "0"


class StreamState:
    """What a streamed reply has said so far, fed its lines as they come.

    One ``data:`` line is one event's JSON nearly always, and is parsed as it comes. SSE also lets
    an event's data run over several ``data:`` lines (joined with LF; the event ends at a blank
    line): when a ``data:`` line does not parse on its own, it and the next ``data:`` lines are
    kept until the blank line, then parsed as one ``data:`` line, stamped with the arrival of the
    last of them. So the common case costs nothing more, and a line that is simply broken still
    fails, at the end of its event.
    """

    __slots__ = (
        "chunk_ns", "chunk_tokens", "counts", "done", "error", "output_ns", "parse", "parts", "pending",
        "pending_ns", "reasoning", "timings", "usage",
    )  # fmt: skip

    def __init__(
        self, parse: Callable[[bytes], StreamEvent | None], res: StreamResult, counts: ChunkCounts | None = None
    ) -> None:
        self.parse = parse
        self.counts = counts  # loadgen.engine.health.ChunkCounts: token chunks, and those sharing a recv
        self.chunk_ns = res.chunk_ns
        self.chunk_tokens = res.chunk_tokens
        self.parts: list[str] = []
        self.usage: Usage | None = None
        self.timings: dict | None = None
        self.error: StreamEvent | None = None
        self.done = False
        self.pending: list[bytes] | None = None  # the data of an event over several data: lines
        self.pending_ns = 0
        self.output_ns: int | None = None  # the first token-bearing chunk that is not reasoning
        self.reasoning = 0  # tokens the reasoning chunks carried

    def take(self, lines: list[bytes], t_recv_ns: int) -> bool:
        """Parse ``lines`` (all received at ``t_recv_ns``); True once the stream has said its last
        (its end marker, or an error)."""
        if self.pending is not None:
            return self._take_pending(iter(lines), t_recv_ns)
        parse = self.parse
        counts = self.counts
        it = iter(lines)  # on a data: line that does not parse, the rest goes to _take_pending
        for line in it:
            if not line or line == b"\r":
                continue
            try:
                ev = parse(line)
            except BadChunk:
                if not line.startswith(b"data:"):
                    raise
                self.pending = [_data_value(line)]
                self.pending_ns = t_recv_ns
                return self._take_pending(it, t_recv_ns)
            if ev is None:
                continue
            # What follows is _apply, written out: a method call per chunk costs ~0.1 µs of a
            # per-chunk budget of ~20 µs (docs/performance.md). Change both together.
            if ev.tokens:
                chunk_ns = self.chunk_ns
                if counts is not None:
                    counts.token_chunks += 1
                    if chunk_ns and chunk_ns[-1] == t_recv_ns:  # one recv, one stamp: the gap is lost
                        counts.coalesced += 1
                chunk_ns.append(t_recv_ns)
                self.chunk_tokens.append(ev.tokens)
                if ev.reasoning:
                    self.reasoning += ev.tokens
                elif self.output_ns is None:
                    self.output_ns = t_recv_ns
            if ev.text:
                self.parts.append(ev.text)
            if ev.usage is not None:
                self.usage = ev.usage
            if ev.server_timings is not None:
                self.timings = ev.server_timings
            if ev.error is not None:
                self.error = ev
                return True
            if ev.done:
                self.done = True
                return True
        return False

    def _take_pending(self, it: Iterator[bytes], t_recv_ns: int) -> bool:
        """``take`` while an event's data runs over several ``data:`` lines: they are kept to its
        blank line, then the event is parsed whole and the lines after it go the usual way."""
        pending = self.pending
        for line in it:
            if not line or line == b"\r":
                if self.dispatch():
                    return True
                return self.take(list(it), t_recv_ns)
            if line.startswith(b"data:"):
                pending.append(_data_value(line))  # type: ignore[union-attr]
                self.pending_ns = t_recv_ns
                continue
            ev = self.parse(line)  # a comment or an event:/id: field inside the event: nothing
            if ev is not None and self._apply(ev, t_recv_ns):
                return True
        return False

    def dispatch(self) -> bool:
        """The event kept over several ``data:`` lines, parsed as one; True when it was the last.
        Raises what the adapter raises when the joined data does not parse either."""
        data, self.pending = self.pending, None
        if data is None:
            return False
        ev = self.parse(b"data:" + b"\n".join(data))
        return ev is not None and self._apply(ev, self.pending_ns)

    def _apply(self, ev: StreamEvent, t_recv_ns: int) -> bool:
        """``take``'s handling of one event, off its fast path; True when it was the last."""
        if ev.tokens:
            if self.counts is not None:
                self.counts.token_chunks += 1
                if self.chunk_ns and self.chunk_ns[-1] == t_recv_ns:
                    self.counts.coalesced += 1
            self.chunk_ns.append(t_recv_ns)
            self.chunk_tokens.append(ev.tokens)
            if ev.reasoning:
                self.reasoning += ev.tokens
            elif self.output_ns is None:
                self.output_ns = t_recv_ns
        if ev.text:
            self.parts.append(ev.text)
        if ev.usage is not None:
            self.usage = ev.usage
        if ev.server_timings is not None:
            self.timings = ev.server_timings
        if ev.error is not None:
            self.error = ev
            return True
        if ev.done:
            self.done = True
            return True
        return False


def _data_value(line: bytes) -> bytes:
    """The value of a ``data:`` line: after the colon, less one leading space and the CR of a CRLF."""
    value = line[5:]
    if value.endswith(b"\r"):
        value = value[:-1]
    return value[1:] if value.startswith(b" ") else value


# The adapters' stream classes whose lines loadgen/engine/_chat.c reads (their COMPILED_PATH).
COMPILED_PATHS = ("openai-chat", "openai-completions", "llama-server", "anthropic-messages", "openai-responses", "sglang")


def stream_take(st: StreamState) -> Callable[[list[bytes], int], bool]:
    """``st.take``, or its compiled twin where one applies: an OpenAI chat or completions stream,
    llama-server's native one, an Anthropic Messages, an OpenAI Responses or an SGLang native
    stream (each its adapter's own stream class, not a subclass), read by the compiled reader. ``_chat.ChatTaker.take``
    applies the chunk lines in their plain shapes in C, to the same state, and hands the first
    other line, with the rest, to ``st.take`` (loadgen/engine/_chat.c)."""
    stream = getattr(st.parse, "__self__", None)
    path = type(stream).__dict__.get("COMPILED_PATH")
    if _chat is not None and READER == "compiled" and path in COMPILED_PATHS:
        if path == "sglang":  # its events carry usage, made here as the adapter makes it
            return _chat.ChatTaker(st, stream, path, Usage).take
        return _chat.ChatTaker(st, stream, path).take
    return st.take
