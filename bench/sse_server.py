"""A minimal OpenAI-compatible streaming server that logs when it wrote every chunk: ground truth
for timing a client, independent of the simulated engine.

It answers ``POST /v1/chat/completions`` (any body with ``max_tokens``) with a chunked
server-sent-event stream in the format vLLM writes: a role-only chunk, ``max_tokens`` content
chunks of one token each, a usage chunk (``choices: []``) and ``data: [DONE]``. Tokens go out
like an engine's decode batch: one tick writes the next chunk of every open stream, ticks are
``--interval-ms`` apart on an absolute grid (0: back to back, each pass as soon as the previous
one is written, and a stream whose socket is full waits, so the client sets the pace).
``GET /v1/models`` lists one model, so a client's identity check passes.

Every request is logged (JSON lines, written at exit): ``request_id`` (the ``X-Request-ID``
header), ``t_received_ns`` (the kernel's receive timestamp of the request's last bytes, so the
server's own loop delay is not in it), ``t_chunks_ns`` (right before each content
chunk's write) and ``t_end_ns``, all ``time.perf_counter_ns()`` (CLOCK_MONOTONIC: the same clock
as a client on this machine). ``--cpu N`` pins the process to core N.

    python bench/sse_server.py --port 0 --interval-ms 10 --log truth.jsonl --cpu 1

Prints ``READY <port>`` once listening; SIGTERM or SIGINT writes the log and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import struct
import sys
import time

import orjson

_perf_ns = time.perf_counter_ns


def _chunk(payload: bytes) -> bytes:
    """One HTTP/1.1 chunk holding one SSE event."""
    event = b"data: " + payload + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(event), event)


_HEAD = b'{"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,"model":"bench","choices":'
ROLE_CHUNK = _chunk(_HEAD + b'[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}')
TOKEN_CHUNK = _chunk(_HEAD + b'[{"index":0,"delta":{"content":" tok"},"logprobs":null,"finish_reason":null}]}')
DONE = _chunk(b"[DONE]") + b"0\r\n\r\n"
STREAM_HEADERS = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)
MODELS_BODY = b'{"object":"list","data":[{"id":"bench","object":"model","owned_by":"bench"}]}'


def _usage_chunk(prompt_tokens: int, completion_tokens: int) -> bytes:
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
             "total_tokens": prompt_tokens + completion_tokens}  # fmt: skip
    return _chunk(_HEAD + b"[],\"usage\":" + orjson.dumps(usage) + b"}")


def _plain(status: str, body: bytes, content_type: bytes = b"application/json") -> bytes:
    return b"HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s" % (
        status.encode(), content_type, len(body), body,
    )  # fmt: skip


class Stream:
    __slots__ = ("conn", "prompt_tokens", "remaining", "request_id", "t_chunks_ns", "t_received_ns", "tokens")

    def __init__(self, conn: Connection, request_id: str, tokens: int, t_received_ns: int) -> None:
        self.conn = conn
        self.request_id = request_id
        self.tokens = self.remaining = tokens
        self.t_received_ns = t_received_ns
        self.t_chunks_ns: list[int] = []
        self.prompt_tokens = 0


class Server:
    """The batch: open streams, written one chunk each per tick."""

    def __init__(self, interval_ns: int) -> None:
        self.interval_ns = interval_ns
        self.streams: list[Stream] = []
        self.finished: list[dict] = []
        self.wake = asyncio.Event()

    def open(self, stream: Stream) -> None:
        stream.conn.write(STREAM_HEADERS + ROLE_CHUNK)
        self.streams.append(stream)
        self.wake.set()

    async def run(self) -> None:
        next_tick = _perf_ns()
        while True:
            if not self.streams:
                self.wake.clear()
                await self.wake.wait()
                next_tick = _perf_ns()
            if self.interval_ns:
                next_tick += self.interval_ns
                delay = next_tick - _perf_ns()
                if delay < 0:  # a late tick: keep the grid, don't burst to catch up
                    next_tick -= delay
                await asyncio.sleep(max(0, delay) / 1e9)
            else:
                await asyncio.sleep(0)
            self.tick()

    def tick(self) -> None:
        keep = []
        for s in self.streams:
            conn = s.conn
            if conn.closed:
                self._finish(s, complete=False)
                continue
            if not self.interval_ns and conn.pending:
                keep.append(s)  # back to back: the client's socket is full, it sets the pace
                continue
            s.t_chunks_ns.append(_perf_ns())
            s.remaining -= 1
            if s.remaining > 0:
                conn.write(TOKEN_CHUNK)
                keep.append(s)
            else:
                conn.write(TOKEN_CHUNK + _usage_chunk(s.prompt_tokens, s.tokens) + DONE)
                self._finish(s, complete=True)
        self.streams = keep

    def _finish(self, s: Stream, complete: bool) -> None:
        self.finished.append({
            "request_id": s.request_id, "t_received_ns": s.t_received_ns, "t_chunks_ns": s.t_chunks_ns,
            "t_end_ns": _perf_ns(), "complete": complete,
        })  # fmt: skip


_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
_ANC_SIZE = socket.CMSG_SPACE(16)


class Connection:
    """One client connection on raw non-blocking sockets, read with ``recvmsg`` so that a request's
    arrival is the kernel's receive timestamp: a busy server loop does not move its truth."""

    def __init__(self, server: Server, sock: socket.socket, loop: asyncio.AbstractEventLoop) -> None:
        self.server, self.sock, self.loop = server, sock, loop
        self.buf = b""
        self.pending = b""  # bytes the socket did not take yet
        self.closed = False
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
        loop.add_reader(sock.fileno(), self.readable)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.loop.remove_reader(self.sock.fileno())
            if self.pending:
                self.loop.remove_writer(self.sock.fileno())
            self.sock.close()

    def write(self, data: bytes) -> None:
        if self.closed:
            return
        if self.pending:
            self.pending += data
            return
        try:
            n = self.sock.send(data)
        except BlockingIOError:
            n = 0
        except OSError:
            self.close()
            return
        if n < len(data):
            self.pending = data[n:]
            self.loop.add_writer(self.sock.fileno(), self.writable)

    def writable(self) -> None:
        try:
            n = self.sock.send(self.pending)
        except BlockingIOError:
            return
        except OSError:
            self.close()
            return
        self.pending = self.pending[n:]
        if not self.pending:
            self.loop.remove_writer(self.sock.fileno())

    def readable(self) -> None:
        try:
            data, anc, _flags, _addr = self.sock.recvmsg(65536, _ANC_SIZE)
        except BlockingIOError:
            return
        except OSError:
            self.close()
            return
        if not data:
            self.close()
            return
        t_received = _perf_ns()
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(payload) >= 16:
                sec, nsec = struct.unpack_from("qq", payload)
                t_received = min(t_received, sec * 1_000_000_000 + nsec - (time.time_ns() - _perf_ns()))
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].decode("latin-1").split("\r\n")
            headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in head[1:])}
            size = int(headers.get("content-length", "0"))
            if len(self.buf) < end + 4 + size:
                return
            body = self.buf[end + 4 : end + 4 + size]
            self.buf = self.buf[end + 4 + size :]
            self.handle(head[0].split(" "), headers, body, t_received)

    def handle(self, request_line: list[str], headers: dict[str, str], body: bytes, t_received: int) -> None:
        method, path = request_line[0], request_line[1]
        if method == "GET" and path.endswith("/v1/models"):
            self.write(_plain("200 OK", MODELS_BODY))
        elif method == "GET" and path.endswith("/health"):
            self.write(_plain("200 OK", b"{}"))
        elif method == "POST" and path.endswith("/chat/completions"):
            req = orjson.loads(body)
            s = Stream(self, headers.get("x-request-id", ""), max(1, int(req.get("max_tokens") or 16)), t_received)
            s.prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in req.get("messages", []))
            self.server.open(s)
        else:
            self.write(_plain("404 Not Found", b'{"error":"not found"}'))


async def serve(port: int, interval_ms: float, log_path: str | None) -> None:
    server = Server(int(interval_ms * 1e6))
    loop = asyncio.get_running_loop()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(4096)
    listener.setblocking(False)
    conns: list[Connection] = []

    def accept() -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except BlockingIOError:
                return
            conns.append(Connection(server, sock, loop))

    loop.add_reader(listener.fileno(), accept)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    ticker = asyncio.create_task(server.run())
    print(f"READY {listener.getsockname()[1]}", flush=True)
    await stop.wait()
    ticker.cancel()
    loop.remove_reader(listener.fileno())
    listener.close()
    for c in conns:
        c.close()
    if log_path:
        with open(log_path, "wb") as f:
            for rec in server.finished:
                f.write(orjson.dumps(rec) + b"\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0: any free one)")
    ap.add_argument("--interval-ms", type=float, default=10.0, help="time between tokens; 0: back to back")
    ap.add_argument("--log", default=None, help="where to write the per-request write times (JSON lines)")
    ap.add_argument("--cpu", type=int, default=None, help="pin to this CPU core")
    args = ap.parse_args()
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    try:
        import gc

        gc.freeze()  # full GC passes would stall the ticks the client is timed against
    except AttributeError:
        pass
    asyncio.run(serve(args.port, args.interval_ms, args.log))
    sys.exit(0)


if __name__ == "__main__":
    main()
