"""Reading a proxied reply on the side: how many tokens it generated, and its text.

The relay hands every chunk to the client first; the assembler process (``recorder.py``) then
feeds it to a ``ReplyMeter``. The output length is
``usage.completion_tokens`` when the server reports it, else the sum of the token-bearing chunks
(a stream) or the reply text's tokens under loadgen's tokenizer (a whole body), all as loadgen's
own adapters read them (``targets.adapters``: the OpenAI ones, ``anthropic-messages`` and
``openai-responses``). A stream is whole at ``data: [DONE]`` (OpenAI chat and completions),
``message_stop`` (Messages) or ``response.completed``/``response.incomplete`` (Responses). A
Responses reply also gives its ``id`` (what a later request's ``previous_response_id`` names) and
the function calls it made (``call_id`` -> ``name``), read from its final ``response`` object.

Per chunk the meter only splits SSE lines and keeps them; a line is parsed at once only when it
may carry ``usage`` or an error (a substring test), so the common stream costs one JSON parse per
reply, not one per token. The kept lines are parsed only when they are needed: no usage came, or
the text is (``/v1/completions``, whose next prompt holds the reply); then at the reply's end, in
the assembler process, where no relay waits behind the parse. Compressed bodies (``gzip``,
``deflate``) are decompressed for reading only; the client gets them as they came.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import orjson

from loadgen.capture.apis import CHAT, COMPLETIONS, MESSAGES, RESPONSES
from targets.adapters.anthropic import AnthropicMessagesAdapter
from targets.adapters.base import Adapter, BadChunk, StreamEvent
from targets.adapters.openai import OpenAIChatAdapter, OpenAICompletionsAdapter
from targets.adapters.responses import OpenAIResponsesAdapter
from workloads.tokenizer import count_tokens

# A reply bigger than this is forwarded whole but recorded only if its usage says its length.
MAX_HELD_BYTES = 64 * 1024 * 1024
_ADAPTERS: dict[str, Adapter] = {
    CHAT: OpenAIChatAdapter(),
    COMPLETIONS: OpenAICompletionsAdapter(),
    MESSAGES: AnthropicMessagesAdapter(),
    RESPONSES: OpenAIResponsesAdapter(),
}
# Substrings of the stream lines that are parsed at once: they may hold the usage, an error or
# the stream's end (the rest are token chunks, parsed only if no usage comes).
_SIGNALS: dict[str, tuple[bytes, ...]] = {
    CHAT: (b'"usage"', b'"error"', b"[DONE]"),
    COMPLETIONS: (b'"usage"', b'"error"', b"[DONE]"),
    MESSAGES: (b'"usage"', b'"error"', b"[DONE]", b"message_stop"),
    RESPONSES: (b'"usage"', b'"error"', b"[DONE]", b"response.completed", b"response.incomplete"),
}
_RESPONSES_ENDS = (b"response.completed", b"response.incomplete")


@dataclass(frozen=True, slots=True)
class Reply:
    output_tokens: int
    text: str  # empty for chat replies whose usage gave the length (nothing needs their text)
    response_id: str | None = None  # a Responses reply's id
    calls: dict[str, str] | None = None  # a Responses reply's function calls: call_id -> name


class ReplyMeter:
    """Fed the reply's bytes in order; ``finish()`` says what it held, or None if unreadable."""

    def __init__(
        self,
        endpoint: str,
        *,
        content_type: str,
        content_encoding: str,
    ) -> None:
        self._adapter = _ADAPTERS[endpoint]
        self._signals = _SIGNALS[endpoint]
        self._responses = endpoint == RESPONSES
        self.response_id: str | None = None
        self.calls: dict[str, str] | None = None
        self._needs_text = endpoint == COMPLETIONS
        self._streaming = content_type.split(";")[0].strip().lower() == "text/event-stream"
        encoding = content_encoding.strip().lower()
        self._inflate = zlib.decompressobj(47) if encoding in ("gzip", "x-gzip", "deflate") else None
        self._unreadable = encoding not in ("", "identity", "gzip", "x-gzip", "deflate")
        self._partial = b""
        self._held: list[bytes] = []  # stream lines, or body pieces, in order
        self._held_bytes = 0
        self._completion_tokens: int | None = None
        self._error = False
        self.stream_done = False  # the stream's own end marker (``data: [DONE]``) went by
        # The kept stream lines parsed so far (held[:_parsed]), in order, by one parser.
        self._parser = self._adapter.new_stream()
        self._parsed = 0
        self._tokens = 0
        self._texts: list[str] = []
        self._finished = False

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
        if self._partial:
            data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()
        if any(signal in data for signal in self._signals):
            for line in lines:
                self._line(line)
        elif lines:  # the common read: token chunks only, kept as they are (blank lines too)
            self._keep(lines, len(data) - len(self._partial))

    def _line(self, line: bytes) -> None:
        if len(line) <= 1:  # blank lines (b"" or b"\r") end an SSE event and carry nothing
            return
        if b'"usage"' in line or b'"error"' in line or b"message_stop" in line:
            event = self._parse(self._adapter.new_stream(), line)
            if event is not None:
                self._take_counts(event)
                if event.done and event.error is None and line.startswith(b"data:"):
                    self.stream_done = True  # message_stop, response.completed/incomplete
            if self._responses and any(end in line for end in _RESPONSES_ENDS):
                self._take_response(line[5:] if line.startswith(b"data:") else b"")
        elif line.rstrip(b"\r").endswith(b"[DONE]") and line.startswith(b"data:"):
            self.stream_done = True
            return
        self._hold(line)

    def _take_response(self, payload: bytes) -> None:
        """The id and function calls of a Responses reply, from its final ``response`` object
        (a streamed end event's, or a whole body's)."""
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return
        resp = obj.get("response", obj) if type(obj) is dict else None
        if type(resp) is not dict:
            return
        rid = resp.get("id")
        self.response_id = rid if type(rid) is str and rid else None
        calls = {
            item["call_id"]: item["name"]
            for item in resp.get("output") or ()
            if type(item) is dict and item.get("type") == "function_call"
            and type(item.get("call_id")) is str and type(item.get("name")) is str
        }  # fmt: skip
        self.calls = calls or None

    def _hold(self, data: bytes) -> None:
        self._keep([data], len(data))

    def _keep(self, items: list[bytes], nbytes: int) -> None:
        self._held_bytes += nbytes
        if self._held_bytes <= MAX_HELD_BYTES:
            self._held.extend(items)
        elif self._held:
            self._held = []  # too big to keep: only a reported usage can tell its length
            self._parsed = 0

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

    def parse_some(self, n: int) -> bool:
        """Parse up to ``n`` more kept stream lines; True while some are left to parse."""
        if self._finished or self._error or self._unreadable:
            return False
        held, parser, parse = self._held, self._parser, self._parse
        stop = min(len(held), self._parsed + n)
        for i in range(self._parsed, stop):
            line = held[i]
            if len(line) <= 1:  # an SSE event's blank line
                continue
            event = parse(parser, line)
            if event is not None:
                self._tokens += event.tokens
                self._texts.append(event.text)
        self._parsed = stop
        return stop < len(held)

    def finish(self) -> Reply | None:
        """The reply, or None when it carried an error or could not be read."""
        if self._partial:
            self._line(self._partial)
            self._partial = b""
        if self._unreadable or self._error:
            self._finished = True
            return None
        if self._completion_tokens is not None and not self._needs_text:
            self._finished = True
            return Reply(self._completion_tokens, "", self.response_id, self.calls)
        if self._held_bytes > MAX_HELD_BYTES:
            self._finished = True
            return None
        if self._streaming:
            while self.parse_some(len(self._held)):
                pass
            self._finished = True
            tokens, text = self._tokens, "".join(self._texts)
        else:
            self._finished = True
            body = b"".join(self._held)
            try:
                event = self._adapter.parse_response(body)
            except BadChunk:
                return None
            self._take_counts(event)
            if self._error:
                return None
            text = event.text
            if self._responses:
                self._take_response(body)
        if self._completion_tokens is not None:
            return Reply(self._completion_tokens, text, self.response_id, self.calls)
        # No usage: a stream counts its token-bearing chunks, a whole body its text's tokens.
        return Reply(tokens if self._streaming else count_tokens(text), text, self.response_id, self.calls)
