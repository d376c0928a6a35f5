"""Reading a proxied reply on the side: how many tokens it generated, and its text.

The proxy hands every chunk to the client first and then to a ``ReplyMeter``. The output length is
``usage.completion_tokens`` when the server reports it, else the sum of the token-bearing chunks
(a stream) or the reply text's tokens under loadgen's tokenizer (a whole body), all as loadgen's
own OpenAI adapters (``targets.adapters.openai``) read them.

Per chunk the meter only splits SSE lines and keeps them; a line is parsed at once only when it
may carry ``usage`` or an error (a substring test), so the common stream costs one JSON parse per
reply, not one per token. The kept lines are parsed at the end only when they are needed: no
usage came, or the text is (``/v1/completions``, whose next prompt holds the reply). Compressed
bodies (``gzip``, ``deflate``) are decompressed for reading only; the client gets them as they came.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from targets.adapters.base import Adapter, BadChunk, StreamEvent
from targets.adapters.openai import OpenAIChatAdapter, OpenAICompletionsAdapter
from workloads.tokenizer import count_tokens

# A reply bigger than this is forwarded whole but recorded only if its usage says its length.
MAX_HELD_BYTES = 64 * 1024 * 1024
_ADAPTERS: dict[str, Adapter] = {"chat": OpenAIChatAdapter(), "completions": OpenAICompletionsAdapter()}


@dataclass(frozen=True, slots=True)
class Reply:
    output_tokens: int
    text: str  # empty for chat replies whose usage gave the length (nothing needs their text)


class ReplyMeter:
    """Fed the reply's bytes in order; ``finish()`` says what it held, or None if unreadable."""

    def __init__(self, endpoint: str, *, content_type: str, content_encoding: str) -> None:
        self._adapter = _ADAPTERS[endpoint]
        self._needs_text = endpoint == "completions"
        self._streaming = content_type.split(";")[0].strip().lower() == "text/event-stream"
        encoding = content_encoding.strip().lower()
        self._inflate = zlib.decompressobj(47) if encoding in ("gzip", "x-gzip", "deflate") else None
        self._unreadable = encoding not in ("", "identity", "gzip", "x-gzip", "deflate")
        self._partial = b""
        self._held: list[bytes] = []  # stream lines, or body pieces, not parsed yet
        self._held_bytes = 0
        self._completion_tokens: int | None = None
        self._error = False
        self.stream_done = False  # the stream's own end marker (``data: [DONE]``) went by

    def feed(self, data: bytes) -> None:
        if self._unreadable or self._error:
            return
        if self._inflate is not None:
            try:
                data = self._inflate.decompress(data)
            except zlib.error:
                self._unreadable = True
                return
        if not self._streaming:
            self._hold(data)
            return
        lines = (self._partial + data if self._partial else data).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            self._line(line)

    def _line(self, line: bytes) -> None:
        if len(line) <= 1:  # blank lines (b"" or b"\r") end an SSE event and carry nothing
            return
        if b'"usage"' in line or b'"error"' in line:
            event = self._parse(self._adapter.new_stream(), line)
            if event is not None:
                self._take_counts(event)
        elif line.rstrip(b"\r").endswith(b"[DONE]") and line.startswith(b"data:"):
            self.stream_done = True
            return
        self._hold(line)

    def _hold(self, data: bytes) -> None:
        self._held_bytes += len(data)
        if self._held_bytes <= MAX_HELD_BYTES:
            self._held.append(data)
        elif self._held:
            self._held = []  # too big to keep: only a reported usage can tell its length

    @staticmethod
    def _parse(parser, line: bytes) -> StreamEvent | None:
        try:
            return parser.parse_line(line)
        except BadChunk:
            return None  # the client saw it as it was; it generated nothing we can count

    def _take_counts(self, event: StreamEvent) -> None:
        if event.error is not None:
            self._error = True
        elif event.usage is not None and event.usage.completion_tokens is not None:
            self._completion_tokens = event.usage.completion_tokens

    def finish(self) -> Reply | None:
        """The reply, or None when it carried an error or could not be read."""
        if self._partial:
            self._line(self._partial)
            self._partial = b""
        if self._unreadable or self._error:
            return None
        if self._completion_tokens is not None and not self._needs_text:
            return Reply(self._completion_tokens, "")
        if self._held_bytes > MAX_HELD_BYTES:
            return None
        tokens, texts = 0, []
        if self._streaming:
            parser = self._adapter.new_stream()
            for line in self._held:
                event = self._parse(parser, line)
                if event is not None:
                    tokens += event.tokens
                    texts.append(event.text)
        else:
            try:
                event = self._adapter.parse_response(b"".join(self._held))
            except BadChunk:
                return None
            self._take_counts(event)
            if self._error:
                return None
            texts.append(event.text)
        text = "".join(texts)
        if self._completion_tokens is not None:
            return Reply(self._completion_tokens, text)
        # No usage: a stream counts its token-bearing chunks, a whole body its text's tokens.
        return Reply(tokens if self._streaming else count_tokens(text), text)
