"""Ground truth: what the sim really did for each request, to compare with what a client measured.

Wall times are ``time.perf_counter_ns()`` (CLOCK_MONOTONIC on Linux) taken right before the socket
write, so they compare directly with a client process's ``perf_counter_ns`` on the same host.
Durations in seconds with a ``v_`` prefix or named ``queue_s``/``prefill_s``/``decode_s`` are
*virtual* (engine model) seconds; wall seconds are those times ``time_scale``.
The field list is documented in docs/sim.md.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import orjson

OUTCOME_OK = "ok"
OUTCOME_REJECTED = "rejected"  # queue full: 429 + Retry-After
OUTCOME_FAULT = "fault"  # an injected fault changed the response
OUTCOME_BAD_REQUEST = "bad_request"
OUTCOME_CLIENT_GONE = "client_disconnected"
OUTCOME_SHUTDOWN = "shutdown"


@dataclass(slots=True)
class TruthRecord:
    """One request. JSON keys are the field names (``t_chunks_ns`` becomes a list)."""

    request_id: str
    server_id: str
    endpoint: str  # "chat" | "completions" | "messages" | "responses"
    stream: bool
    t_received_ns: int  # handler start, request headers parsed
    time_scale: float
    status: int = 0  # HTTP status sent
    outcome: str = OUTCOME_OK
    fault: str | None = None  # "http_500" | "http_429" | "stall" | "cut" | "malformed"
    fault_token_index: int | None = None  # token index the mid-stream fault hit before
    error: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0  # token chunks actually written
    max_tokens: int = 0
    t_first_token_ns: int | None = None  # write of the first token chunk
    t_end_ns: int | None = None  # write of the last bytes ([DONE], error body or the cut)
    t_chunks_ns: array = field(default_factory=lambda: array("q"))  # one per token chunk
    queue_s: float | None = None  # virtual: arrival -> admitted into the batch
    prefill_s: float | None = None  # virtual: admitted -> first token
    decode_s: float | None = None  # virtual: first token -> last token
    v_arrival_s: float | None = None  # virtual clock of the engine
    v_first_token_s: float | None = None
    v_end_s: float | None = None
    # Reasoning (profile reasoning_tokens): the tokens streamed as reasoning before the answer,
    # the write of the first answer token chunk (t_first_token_ns when there is no reasoning), and
    # how many times the sim's reasoning word appears in the request (reasoning sent back).
    reasoning_tokens: int = 0
    t_first_output_ns: int | None = None
    prompt_reasoning_words: int = 0
    # perf_counter_ns right after the write of the first token and of the first answer token
    # returned: that write happened between the two stamps (the CPU can be lost in between on a
    # busy machine). None for a write that was the last (the record was complete before it).
    t_first_token_written_ns: int | None = None
    t_first_output_written_ns: int | None = None
    # Where the reply ends (profile eos_lengths): "stop" before max_tokens at the drawn length,
    # "length" at max_tokens; eos_length is the length drawn (None without eos_lengths).
    finish_reason: str | None = None
    eos_length: int | None = None
    # Times the engine preempted the request (KV pressure, profile preemption): each time its KV
    # was freed and later recomputed, a stall in its token times.
    preemptions: int = 0
    # The tool the reply called (profile tool_calls): its answer tokens were the call's arguments;
    # None for a text reply.
    tool_call: str | None = None
    # The client's port of the connection that carried the request: requests with one port (and
    # one client host) came over one connection. None when the transport did not say.
    client_port: int | None = None

    def to_json(self) -> bytes:
        return orjson.dumps(self, default=_default)


def _default(obj: object) -> object:
    if isinstance(obj, array):
        return obj.tolist()
    raise TypeError


class TruthStore:
    """The most recent ``keep`` records by request id, plus an optional JSONL log of every one."""

    def __init__(self, keep: int = 100_000, log_path: str | Path | None = None) -> None:
        self.keep = keep
        self._records: OrderedDict[str, TruthRecord] = OrderedDict()
        self._log: IO[bytes] | None = open(log_path, "ab") if log_path else None  # noqa: SIM115

    def add(self, rec: TruthRecord) -> None:
        """Store a finished record (and append it to the log, flushed)."""
        records = self._records
        records.pop(rec.request_id, None)
        records[rec.request_id] = rec
        if len(records) > self.keep:
            records.popitem(last=False)
        if self._log is not None:
            self._log.write(rec.to_json() + b"\n")
            self._log.flush()

    def get(self, request_id: str) -> TruthRecord | None:
        return self._records.get(request_id)

    def __len__(self) -> int:
        return len(self._records)

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
