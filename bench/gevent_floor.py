"""The floor under loadgen's worker: what a bare gevent loop costs per streamed chunk.

One greenlet per stream, as in a loadgen worker, against ``bench/sse_server.py`` (tokens
``--pace`` apart, 100 per request, the next request as soon as a reply ends), with nothing else:
no HTTP parser, no records, no sessions. Two floors, measured one after the other in one run:

* ``read``: ``recvmsg`` with the kernel's receive stamp (as loadgen reads), counting ``data:``
  lines: the cost of being woken for a chunk and taking it off the socket;
* ``read + json``: the same, plus ``orjson.loads`` of every ``data: {`` line: the least any
  client that looks inside each chunk pays;
* ``one reader``, ``one reader + json``: the same two, but one greenlet reads every socket the
  kernel says is readable (one epoll set, as ``loadgen/engine/stream_reader.py`` does) instead of a
  greenlet per stream waking for each chunk;
* ``sessions + one reader + json``: the shape of a loadgen worker with nothing in it: requests
  arrive open loop at the rate that keeps the streams in flight (closed loop, back to back), each
  in a greenlet of its own spawned at its time, on a kept connection from a pool; it sends, waits
  in its greenlet for the head, hands the body to the one reader and waits for its end; a tuple is
  its record. No HTTP parser, no prompt, no histogram, no deadline. Against ``one reader + json``
  (the same chunks without the per-request shape), it is the least a request costs in a greenlet
  per session: ``bench/generator_capacity.py``'s figure can come no nearer the read floor than
  this.
* ``requests in one loop + json``: the same requests without a greenlet each: one greenlet sends
  each request at its time on a kept connection and leaves it; the one reader reads its head and
  its body and, at its end, makes its record and keeps the connection. What a request costs when
  its path has no greenlet of its own (the callback shape of engines written around one event
  loop): against ``sessions + one reader + json``, what a greenlet per session costs.

Chunks per CPU-second of this process (``time.process_time`` over the window; the server is pinned
to core 0 and this process to core 1 when there are two or more). Put next to
``bench/generator_capacity.py``'s ``/worker-CPU-s`` at the same point, the difference is what
loadgen does per chunk on top (HTTP de-chunking, SSE lines, the adapter's checks, timestamps per
token, records); docs/performance.md has both.

    .venv/bin/python bench/gevent_floor.py                # 500 streams, tokens 10 ms apart
    .venv/bin/python bench/gevent_floor.py -c 100 -c 500 --pace 10
    .venv/bin/python bench/gevent_floor.py -c 500 --mode "one reader + json" --mode "sessions + one reader + json"
    .venv/bin/python bench/gevent_floor.py -c 500 --mode "sessions + one reader + json" --mode "requests in one loop + json"

Prints figures; it is not a test. Everything binds 127.0.0.1 and is stopped at the end.
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import gevent  # noqa: E402
import orjson  # noqa: E402
from gevent.event import Event  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
TOKENS = 100
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
_ANC = socket.CMSG_SPACE(16)
_END = b"0\r\n\r\n"
MODES = (
    "read", "read + json", "one reader", "one reader + json", "sessions + one reader + json",
    "requests in one loop + json",
)  # fmt: skip


def _request(port: int) -> bytes:
    body = orjson.dumps({"model": "bench", "messages": [{"role": "user", "content": "hi"}],
                         "max_tokens": TOKENS, "stream": True})  # fmt: skip
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class Floor:
    def __init__(self, port: int, parse: bool) -> None:
        self.port = port
        self.parse = parse
        self.chunks = 0

    def stream_forever(self) -> None:
        req = _request(self.port)
        sock = socket.create_connection(("127.0.0.1", self.port))
        sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
        loads = orjson.loads
        while True:
            sock.sendall(req)
            tail = b""
            while True:
                data, _anc, _flags, _addr = sock.recvmsg(65536, _ANC)
                if not data:
                    return
                if self.parse:
                    for line in data.split(b"\n"):
                        if line.startswith(b"data: {"):
                            loads(line[6:])
                self.chunks += data.count(b"data: ")
                tail = (tail + data)[-len(_END) :]
                if tail == _END:
                    break


class OneReader(Floor):
    """Every stream's socket in one epoll set, read by one greenlet."""

    def run(self, streams: int) -> None:
        epoll = monkey.get_original("select", "epoll")()
        req = _request(self.port)
        socks: dict[int, socket.socket] = {}
        tails: dict[int, bytes] = {}
        for _ in range(streams):
            sock = socket.create_connection(("127.0.0.1", self.port))
            sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
            sock.sendall(req)
            socks[sock.fileno()], tails[sock.fileno()] = sock, b""
            epoll.register(sock.fileno(), 1)  # EPOLLIN, level-triggered
        watcher = gevent.get_hub().loop.io(epoll.fileno(), 1)
        loads = orjson.loads
        try:
            while True:
                gevent.get_hub().wait(watcher)
                for fd, _mask in epoll.poll(0):
                    sock = socks[fd]
                    try:
                        data, _anc, _flags, _addr = sock._sock.recvmsg(65536, _ANC)
                    except BlockingIOError:
                        continue
                    if self.parse:
                        for line in data.split(b"\n"):
                            if line.startswith(b"data: {"):
                                loads(line[6:])
                    self.chunks += data.count(b"data: ")
                    tail = tails[fd] = (tails[fd] + data)[-len(_END) :]
                    if tail == _END:
                        tails[fd] = b""
                        sock.sendall(req)
        finally:
            for sock in socks.values():
                sock.close()
            epoll.close()


class Sessions(Floor):
    """A greenlet per request, one reader for the bodies, kept connections (see the docstring)."""

    def __init__(self, port: int, parse: bool, pace_ms: float) -> None:
        super().__init__(port, parse)
        self.pace_ms = pace_ms
        self.records: list[tuple[int, int, int]] = []
        self._idle: list[socket.socket] = []
        self._following: dict[int, list] = {}  # fd -> [sock, tail, done event]
        self._epoll = monkey.get_original("select", "epoll")()
        self._reader: gevent.Greenlet | None = None
        self._req = _request(port)

    def run(self, streams: int) -> None:
        from gevent.pool import Pool

        pool = Pool()
        try:
            if not self.pace_ms:
                for _ in range(streams):
                    pool.spawn(self._agent)
                pool.join()
                return
            gap_ns = int(TOKENS * self.pace_ms * 1e6 / streams)  # the rate that keeps `streams` in flight
            t_ns = time.perf_counter_ns()
            while True:
                t_ns += gap_ns
                while (left := t_ns - time.perf_counter_ns()) > 0:
                    gevent.sleep(left / 1e9)
                pool.spawn(self._request_once, t_ns)
        finally:
            pool.kill(block=True, timeout=5)
            if self._reader is not None:
                self._reader.kill(block=True, timeout=5)
            for sock in self._idle:
                sock.close()
            self._epoll.close()

    def _agent(self) -> None:
        while True:
            self._request_once(time.perf_counter_ns())

    def _request_once(self, t_sched_ns: int) -> None:
        sock = self._idle.pop() if self._idle else self._connect()
        t_send_ns = time.perf_counter_ns()
        sock.sendall(self._req)
        head = b""
        while (end := head.find(b"\r\n\r\n")) < 0:
            data = sock.recv(65536)
            if not data:
                sock.close()
                return
            head += data
        status = int(head[9:12])
        body = head[end + 4 :]
        fd = sock.fileno()
        entry = self._following[fd] = [sock, b"", Event()]
        if body:
            self._take(fd, entry, body)
        if not entry[2].is_set():
            self._epoll.register(fd, 1)
            if self._reader is None:
                self._reader = gevent.spawn(self._read_bodies)
            entry[2].wait()
        self.records.append((t_sched_ns, t_send_ns, status))
        self._idle.append(sock)

    def _connect(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port))
        sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
        return sock

    def _body_ended(self, entry: list, data: bytes) -> bool:
        """A read of a body: its chunks parsed and counted; whether the body ended with it."""
        if self.parse:
            for line in data.split(b"\n"):
                if line.startswith(b"data: {"):
                    orjson.loads(line[6:])
        self.chunks += data.count(b"data: ")
        entry[1] = (entry[1] + data)[-len(_END) :]
        return entry[1] == _END

    def _take(self, fd: int, entry: list, data: bytes) -> None:
        if self._body_ended(entry, data):
            del self._following[fd]
            entry[2].set()

    def _read_bodies(self) -> None:
        watcher = gevent.get_hub().loop.io(self._epoll.fileno(), 1)
        try:
            while self._following:
                events = self._epoll.poll(0)
                if not events:
                    gevent.get_hub().wait(watcher)
                    continue
                for fd, _mask in events:
                    entry = self._following.get(fd)
                    if entry is None:
                        continue
                    try:
                        data, _anc, _flags, _addr = entry[0]._sock.recvmsg(65536, _ANC)
                    except BlockingIOError:
                        continue
                    self._take(fd, entry, data)
                    if fd not in self._following:
                        self._epoll.unregister(fd)
        finally:
            self._reader = None


class OneLoop(Sessions):
    """The requests of ``Sessions`` with no greenlet each (see the docstring): sent from the
    arrivals' greenlet, their heads and bodies read by the one reader, their records made there."""

    def run(self, streams: int) -> None:
        try:
            if not self.pace_ms:
                for _ in range(streams):
                    self._send(time.perf_counter_ns())
            else:
                gap_ns = int(TOKENS * self.pace_ms * 1e6 / streams)
                t_ns = time.perf_counter_ns()
                while True:
                    t_ns += gap_ns
                    while (left := t_ns - time.perf_counter_ns()) > 0:
                        gevent.sleep(left / 1e9)
                    self._send(t_ns)
            gevent.sleep(1e9)
        finally:
            if self._reader is not None:
                self._reader.kill(block=True, timeout=5)
            for entry in self._following.values():
                entry[0].close()
            for sock in self._idle:
                sock.close()
            self._epoll.close()

    def _send(self, t_sched_ns: int) -> None:
        sock = self._idle.pop() if self._idle else self._connect()
        t_send_ns = time.perf_counter_ns()
        sock._sock.sendall(self._req)  # a few hundred bytes: the socket's buffer takes them at once
        fd = sock.fileno()
        # [socket, tail, head so far or None once read, status, scheduled, sent]
        self._following[fd] = [sock, b"", b"", 0, t_sched_ns, t_send_ns]
        try:
            self._epoll.register(fd, 1)
        except FileExistsError:  # back to back: sent again from _take, before the reader let go
            self._epoll.modify(fd, 1)
        if self._reader is None:
            self._reader = gevent.spawn(self._read_bodies)

    def _take(self, fd: int, entry: list, data: bytes) -> None:
        """The one reader's hand-off (``Sessions._read_bodies``): the head first, then the body;
        at its end the record, and the connection kept."""
        if entry[2] is not None:
            head = entry[2] + data
            end = head.find(b"\r\n\r\n")
            if end < 0:
                entry[2] = head
                return
            entry[2], entry[3], data = None, int(head[9:12]), head[end + 4 :]
        if self._body_ended(entry, data):
            del self._following[fd]  # the reader takes it out of the epoll set
            self.records.append((entry[4], entry[5], entry[3]))
            self._idle.append(entry[0])
            if not self.pace_ms:
                self._send(time.perf_counter_ns())


def measure(port: int, streams: int, mode: str, warmup_s: float, window_s: float, pace_ms: float = 10.0) -> dict:
    parse = mode.endswith("json")
    if mode.startswith("requests in one loop"):
        floor = OneLoop(port, parse, pace_ms)
        greenlets = [gevent.spawn(floor.run, streams)]
    elif mode.startswith("sessions"):
        floor = Sessions(port, parse, pace_ms)
        greenlets = [gevent.spawn(floor.run, streams)]
    elif mode.startswith("one reader"):
        floor = OneReader(port, parse)
        greenlets = [gevent.spawn(floor.run, streams)]
    else:
        floor = Floor(port, parse)
        greenlets = [gevent.spawn(floor.stream_forever) for _ in range(streams)]
    try:
        gevent.sleep(warmup_s)
        c0, t0, w0 = floor.chunks, time.process_time(), time.monotonic()
        n0 = len(getattr(floor, "records", ()))
        gevent.sleep(window_s)
        c1, t1, w1 = floor.chunks, time.process_time(), time.monotonic()
        n1 = len(getattr(floor, "records", ()))
    finally:
        gevent.killall(greenlets, block=True, timeout=5)
    cpu = t1 - t0
    return {"chunks_per_s": (c1 - c0) / (w1 - w0), "chunks_per_cpu_s": (c1 - c0) / cpu if cpu else 0.0,
            "cpu_share": cpu / (w1 - w0), "requests_per_s": (n1 - n0) / (w1 - w0)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("-c", "--streams", type=int, action="append", help="concurrent streams (repeatable; default 500)")
    ap.add_argument("--pace", type=float, default=10.0, help="ms between tokens (0: back to back)")
    ap.add_argument("-d", "--duration", type=float, default=4.0, help="measurement window per point, s")
    ap.add_argument("-w", "--warmup", type=float, default=2.0, help="before each window, s")
    ap.add_argument("--mode", action="append", choices=MODES, help="only this floor (repeatable; default all)")
    ap.add_argument("--json", action="store_true", help="also print each point as a JSON line")
    args = ap.parse_args()
    pin = (os.cpu_count() or 1) > 1
    cmd = [sys.executable, str(REPO / "bench" / "sse_server.py"), "--port", "0", "--interval-ms", str(args.pace)]
    if pin:
        cmd += ["--cpu", "0"]
        os.sched_setaffinity(0, {1})
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline() if server.stdout else ""
        if not line.startswith("READY "):
            raise SystemExit(f"bench server did not start: {line!r}")
        port = int(line.split()[1])
        load = os.getloadavg()[0]
        print(f"bare gevent client vs bench/sse_server.py, tokens {args.pace:g} ms apart, {TOKENS} per request; "
              f"{args.duration:g} s windows; load average {load:.1f} on {os.cpu_count()} cores")  # fmt: skip
        print(f"{'streams':>7}  {'floor':<28} {'chunks/s':>9} {'/CPU-s':>9} {'us/chunk':>8} {'CPU':>5} {'requests/s':>10}")
        for streams in args.streams or [500]:
            for name in args.mode or MODES:
                r = measure(port, streams, name, args.warmup, args.duration, args.pace)
                per = 1e6 / r["chunks_per_cpu_s"] if r["chunks_per_cpu_s"] else float("nan")
                reqs = f"{r['requests_per_s']:>10,.0f}" if name.startswith(("sessions", "requests")) else f"{'':>10}"
                print(f"{streams:>7}  {name:<28} {r['chunks_per_s']:>9,.0f} {r['chunks_per_cpu_s']:>9,.0f} "
                      f"{per:>8.1f} {r['cpu_share']:>5.0%} {reqs}", flush=True)  # fmt: skip
                if args.json:
                    print(orjson.dumps({"streams": streams, "pace_ms": args.pace, "mode": name, **r}).decode(), flush=True)
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
