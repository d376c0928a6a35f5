"""A streamed trace for a worker that does not have it: pulled from the master in bounded chunks.

A trace streamed as it is read (``workloads.streamed``) is too large for the plan (one message as
large as the file would stall the master and hold the whole file in its memory and the worker's).
A worker whose host has no file at the plan's path pulls it instead, ``CHUNK_BYTES`` at a time
with at most ``WINDOW`` chunks in flight, into a temporary file under the same name (session ids
carry the file's stem), and replays that. Memory on both sides stays a few chunks, whatever the
file's size; the master only ever serves the run's own workload file, to workers it accepted.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gevent
from gevent.queue import Empty, Queue

from loadgen.config import RunConfig
from loadgen.errors import UserError

MSG_FILE_PULL = "loadgen_file_pull"  # worker -> master: {run_id, offset}
MSG_FILE_CHUNK = "loadgen_file_chunk"  # master -> worker: {run_id, offset, data}
CHUNK_BYTES = 1 << 20
WINDOW = 4
# A chunk that does not come within this long ends the fetch (the master is gone or refuses).
CHUNK_TIMEOUT_S = 30.0


def shipped_size(cfg: RunConfig) -> int | None:
    """The byte size of the run's workload file when workers may pull it (a streamed trace not
    carried in the plan); None otherwise."""
    from workloads.loader import is_streamed_file

    if cfg.workload_text is not None or not os.path.isfile(cfg.workload):
        return None
    if not is_streamed_file(cfg.workload, cfg.workload_format):
        return None
    return os.path.getsize(cfg.workload)


def needs_fetch(cfg: RunConfig, size: int | None) -> bool:
    """Whether this host must pull the workload file: the master offers it and it is not here."""
    return size is not None and cfg.workload_text is None and not os.path.exists(cfg.workload)


def read_chunk(path: str, offset: int) -> bytes:
    """Up to ``CHUNK_BYTES`` of ``path`` from ``offset`` (empty past the end)."""
    with open(path, "rb") as f:
        f.seek(max(0, int(offset)))
        return f.read(CHUNK_BYTES)


class FileFetch:
    """One pull of the master's workload file into a temporary file (see the module docstring).

    ``send(msg_type, data)`` sends to the master; ``on_chunk`` takes each MSG_FILE_CHUNK's data.
    """

    def __init__(self, send: Callable[[str, dict[str, Any]], None], run_id: str, name: str, size: int) -> None:
        self._send = send
        self.run_id = run_id
        self.size = int(size)
        self._dir = tempfile.mkdtemp(prefix="loadgen-workload-")
        atexit.register(shutil.rmtree, self._dir, True)
        self.path = os.path.join(self._dir, os.path.basename(name) or "workload")
        self._chunks: Queue = Queue()

    def on_chunk(self, data: dict[str, Any]) -> None:
        if data.get("run_id") == self.run_id:
            self._chunks.put(data)

    def cancel(self) -> None:
        """The run ended while the pull went on (the master's drain): ``run`` stops at once."""
        self._chunks.put({"cancelled": True})

    def run(self) -> str:
        """Pull the whole file (cooperatively: the event loop runs meanwhile); its local path.
        A one-line ``UserError`` when the master stops answering or the file changed size."""
        t_start = time.monotonic()
        offsets = list(range(0, self.size, CHUNK_BYTES))
        wanted = set(offsets)
        pending = iter(offsets)
        for offset in [o for _, o in zip(range(WINDOW), pending, strict=False)]:
            self._send(MSG_FILE_PULL, {"run_id": self.run_id, "offset": offset})
        with open(self.path, "wb") as f:
            f.truncate(self.size)
            while wanted:
                try:
                    chunk = self._chunks.get(timeout=CHUNK_TIMEOUT_S)
                except Empty:
                    raise UserError(
                        f"--workload: pulling the trace from the master stalled with {len(wanted)} of its "
                        f"{len(offsets)} chunks still to come; copy it to the same path on this host"
                    ) from None
                if chunk.get("cancelled"):
                    raise UserError("--workload: the run ended before the trace was pulled from the master")
                offset, data = int(chunk["offset"]), chunk.get("data") or b""
                if offset not in wanted:
                    continue
                if len(data) != min(CHUNK_BYTES, self.size - offset):
                    raise UserError(
                        f"--workload: the master's trace changed while this worker pulled it (chunk at {offset}); "
                        "start the run again"
                    )
                f.seek(offset)
                f.write(data)
                wanted.discard(offset)
                nxt = next(pending, None)
                if nxt is not None:
                    self._send(MSG_FILE_PULL, {"run_id": self.run_id, "offset": nxt})
                gevent.sleep(0)
        self.seconds = time.monotonic() - t_start
        return self.path


def fetched_config(cfg: RunConfig, path: str) -> RunConfig:
    """``cfg`` reading the workload from the pulled copy at ``path`` (same file name)."""
    from dataclasses import replace

    return replace(cfg, workload=str(Path(path)))
