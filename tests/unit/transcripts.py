"""Recorded event streams (tests/fixtures/transcripts) and the requests the adapter tests build."""

from __future__ import annotations

from pathlib import Path

from targets.adapters.base import ChatRequest, StreamEvent, Usage

TRANSCRIPTS = Path(__file__).resolve().parent.parent / "fixtures" / "transcripts"
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hi"}]


def replay(adapter, name: str) -> list[StreamEvent]:
    """Every event ``adapter`` parses from the recorded stream ``name``, line by line."""
    parser = adapter.new_stream()
    events = []
    for line in (TRANSCRIPTS / name).read_bytes().splitlines(keepends=True):
        ev = parser.parse_line(line)
        if ev is not None:
            events.append(ev)
    return events


def request(**kw) -> ChatRequest:
    base = dict(messages=MESSAGES, max_tokens=64, session_id="sess-9", request_id="req-9-1")
    base.update(kw)
    return ChatRequest(**base)


def fold(events: list[StreamEvent]) -> tuple[int, str, Usage | None, bool, StreamEvent | None]:
    """(tokens, text, last usage, whether it ended, the first error event) of a stream."""
    usage = None
    for ev in events:
        if ev.usage is not None:
            usage = ev.usage
    error = next((ev for ev in events if ev.error is not None), None)
    return (
        sum(ev.tokens for ev in events),
        "".join(ev.text for ev in events),
        usage,
        any(ev.done for ev in events),
        error,
    )
