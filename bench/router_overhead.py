"""What a router adds: TTFT, token delivery and ITL through sglang-router and vllm-router vs direct.

Two simulated replicas (H200 profile: 1,024 slots, so no stream ever waits for one) with, in
front of the same two, each router (round_robin by default). For 1, 50 and 200 concurrent
streams (a keep-alive connection each, a new request as soon as one ends) it measures, per path:

* TTFT added: the client's TTFT minus the sim's own (its handler start to its first-token write),
  i.e. the request's way in plus the first token's way out;
* token delivery: when the client read each token minus when the sim wrote it;
* ITL: the client's gaps between tokens, next to the sim's own gaps;
* the router's CPU per forwarded chunk, from /proc/<pid>/stat over the window.

Why a positive time scale (default 2, i.e. half the H200's speed) and not 0: at time-scale 0 the
sims emit tokens as fast as the CPU lets them, so client, router and sims would compete for the
same cores and the difference between paths would measure that contention. At a positive scale
every token has a fixed wall-clock write time, which the sim records on the same monotonic clock
as the client (CLOCK_MONOTONIC, see docs/sim.md): client read time minus sim write time is
exactly what the path adds. The scale is chosen so that 200 streams (~12,000 tokens/s through the
router) stay well inside what two shared cores serve.

    .venv/bin/python bench/router_overhead.py                    # 1, 50, 200 streams; 4 s each
    .venv/bin/python bench/router_overhead.py -c 50 -d 8 --policy cache_aware
    .venv/bin/python bench/router_overhead.py --quickack         # the client ACKs every read at once
    .venv/bin/python bench/router_overhead.py --kernel-stamps    # token times: when the kernel got them

Each stream sends its next request as soon as a reply ends. sglang-router 0.3.2 then holds the
first tokens of the next reply until the client's delayed ACK (tens of ms: Nagle's algorithm on
the router's socket); ``--quickack`` makes the client ACK at once, which shows the cause
(docs/routers.md).

Prints figures; it is not a test. Everything binds 127.0.0.1 and is stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import struct
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from targets.fleet.fleet import start_sim_replicas
from targets.fleet.procs import stop_all
from targets.fleet.routers import start_router

MARK = b'{"content":" '  # starts every content chunk's delta (the role chunk has none)
DONE = b"data: [DONE]"
CLK_TCK = os.sysconf("SC_CLK_TCK")
ROUTERS = ("sglang", "vllm")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` (fields 14 and 15 of /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


@dataclass
class Sample:
    """One request as the client saw it: send time and the read time of every token (ns)."""

    request_id: str
    t_send_ns: int
    token_ns: list[int] = field(default_factory=list)


_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
_ANC = socket.CMSG_SPACE(16)


class _Reader:
    """A connection's reads, each with its time: when this process read it, or (``kernel``) when
    the kernel received it (``SO_TIMESTAMPNS``, on the perf_counter clock), which no delay of this
    process in reading can move; loadgen's client stamps tokens the same way."""

    def __init__(self, reader: asyncio.StreamReader, sock: socket.socket, kernel: bool) -> None:
        self._reader = reader
        self._sock = sock
        self._kernel = kernel
        if kernel:
            sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)

    async def read(self) -> tuple[bytes, int]:
        if not self._kernel:
            data = await self._reader.read(65536)
            return data, time.perf_counter_ns()
        loop = asyncio.get_running_loop()
        while True:
            try:
                data, anc, _flags, _addr = self._sock.recvmsg(65536, _ANC)
            except BlockingIOError:
                ready = loop.create_future()
                loop.add_reader(self._sock.fileno(), ready.set_result, None)
                try:
                    await ready
                finally:
                    loop.remove_reader(self._sock.fileno())
                continue
            now = time.perf_counter_ns()
            for _level, _kind, payload in anc:
                sec, nsec = struct.unpack_from("qq", payload)
                now = min(now, sec * 1_000_000_000 + nsec - (time.time_ns() - time.perf_counter_ns()))
            return data, now


async def _read_reply(reader: _Reader, sample: Sample, sock: socket.socket | None) -> None:
    """Read one chunked SSE reply to its [DONE], stamping each token with the read that held it.
    With ``sock``, ask the kernel to ACK at once (TCP_QUICKACK lapses, hence once per reply)."""
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
    tail = b""
    while True:
        data, now = await reader.read()
        if not data:
            raise ConnectionError("closed mid-reply")
        buf = tail + data
        new = buf.count(MARK) - tail.count(MARK)
        sample.token_ns.extend([now] * new)
        if DONE in buf:
            # The chunked body's terminator follows [DONE] in the same write; wait for it.
            while not buf.endswith(b"0\r\n\r\n"):
                more, _ = await reader.read()
                if not more:
                    raise ConnectionError("closed after [DONE]")
                buf += more
            return
        tail = buf[-64:]


async def _stream(
    url: str, i: int, args: argparse.Namespace, stop: asyncio.Event, window: list[int], out: list[Sample]
) -> None:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    raw = writer.get_extra_info("socket")
    sock = raw if args.quickack else None
    # The kernel-stamped reads go around asyncio's transport, which then must not read too.
    kernel = args.kernel_stamps
    if kernel:
        writer.transport.pause_reading()
        raw = socket.socket(fileno=os.dup(raw.fileno()))
        raw.setblocking(False)
    conn = _Reader(reader, raw, kernel)
    body = orjson.dumps(
        {
            "model": "bench",
            "messages": [{"role": "user", "content": f"stream {i} " + "word " * 60}],
            "max_tokens": args.max_tokens,
            "stream": True,
        }
    )
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n" % (host.encode(), len(body))
    )
    try:
        while not stop.is_set():
            rid = uuid.uuid4().hex
            sample = Sample(rid, time.perf_counter_ns())
            writer.write(head + b"X-Request-ID: " + rid.encode() + b"\r\n\r\n" + body)
            await _read_reply(conn, sample, sock)
            if window[0] <= sample.t_send_ns and (window[1] == 0 or sample.token_ns[-1] <= window[1]):
                out.append(sample)
    finally:
        writer.close()
        if kernel:
            raw.close()


async def _load(urls: list[str], streams: int, args: argparse.Namespace, pid: int | None):
    """``streams`` connections spread over ``urls``; returns (samples in the window, window s,
    router CPU s in the window)."""
    stop = asyncio.Event()
    window = [1 << 62, 0]
    out: list[Sample] = []
    tasks = [
        asyncio.create_task(_stream(urls[i % len(urls)], i, args, stop, window, out)) for i in range(streams)
    ]
    await asyncio.sleep(args.warmup)
    cpu0 = cpu_seconds(pid) if pid else 0.0
    window[0] = time.perf_counter_ns()
    await asyncio.sleep(args.duration)
    window[1] = time.perf_counter_ns()
    cpu1 = cpu_seconds(pid) if pid else 0.0
    stop.set()
    await asyncio.wait(tasks, timeout=30)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return out, (window[1] - window[0]) / 1e9, cpu1 - cpu0


async def _truths(replica_urls: list[str], samples: list[Sample]) -> dict[str, dict]:
    """The sim's truth record of each request, from whichever replica served it."""
    out: dict[str, dict] = {}
    conns = []
    for u in replica_urls:
        host, port = u.removeprefix("http://").rsplit(":", 1)
        conns.append(await asyncio.open_connection(host, int(port)))
    try:
        for s in samples:
            for reader, writer in conns:
                writer.write(b"GET /sim/requests/%s HTTP/1.1\r\nHost: x\r\n\r\n" % s.request_id.encode())
                status_line = await reader.readline()
                length = 0
                while (line := await reader.readline()) not in (b"\r\n", b""):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length)
                if b" 200 " in status_line:
                    out[s.request_id] = orjson.loads(body)
                    break
    finally:
        for _, writer in conns:
            writer.close()
    return out


def _pct(values: list[float], p: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), p)) if values else float("nan")


def measure(
    path: str, url_list: list[str], replica_urls: list[str], streams: int, args, pid: int | None
) -> dict:
    samples, window_s, cpu_s = asyncio.run(_load(url_list, streams, args, pid))
    truths = asyncio.run(_truths(replica_urls, samples))
    ttft_added, delivery, itl, sim_itl = [], [], [], []
    chunks = 0
    for s in samples:
        t = truths.get(s.request_id)
        if t is None or len(t["t_chunks_ns"]) != len(s.token_ns):
            continue
        chunks += len(s.token_ns)
        sim_ttft = t["t_first_token_ns"] - t["t_received_ns"]
        ttft_added.append((s.token_ns[0] - s.t_send_ns - sim_ttft) / 1e6)
        delivery.extend((c - w) / 1e6 for c, w in zip(s.token_ns[1:], t["t_chunks_ns"][1:], strict=True))
        itl.extend(np.diff(s.token_ns) / 1e6)
        sim_itl.extend(np.diff(t["t_chunks_ns"]) / 1e6)
    return {
        "path": path,
        "streams": streams,
        "requests": len(ttft_added),
        "ttft_added": (_pct(ttft_added, 50), _pct(ttft_added, 99)),
        "delivery": (_pct(delivery, 50), _pct(delivery, 99)),
        "itl": (_pct(itl, 50), _pct(itl, 99)),
        "sim_itl": (_pct(sim_itl, 50), _pct(sim_itl, 99)),
        "chunks_per_s": chunks / window_s if window_s else 0.0,
        "cpu_us_per_chunk": cpu_s / chunks * 1e6 if pid and chunks else None,
        "cpu_share": cpu_s / window_s if pid else None,
    }


def _fmt(pair: tuple[float, float]) -> str:
    return f"{pair[0]:6.2f} / {pair[1]:6.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument(
        "-c", "--concurrency", type=int, action="append", help="streams (repeatable; default 1, 50, 200)"
    )
    ap.add_argument("-d", "--duration", type=float, default=4.0, help="measurement window per point, s")
    ap.add_argument("-w", "--warmup", type=float, default=1.0, help="warm-up before each window, s")
    ap.add_argument("--max-tokens", type=int, default=64, help="tokens per request")
    ap.add_argument(
        "--time-scale", type=float, default=2.0, help="sim wall seconds per simulated second (> 0)"
    )
    ap.add_argument("--policy", default="round_robin", help="policy of both routers")
    ap.add_argument("--profile", default="h200-llama3-8b-fp8")
    ap.add_argument(
        "--quickack", action="store_true", help="the client ACKs every read at once (TCP_QUICKACK)"
    )
    ap.add_argument(
        "--kernel-stamps",
        action="store_true",
        help="token times from the client's kernel receive stamps, not from when it read them",
    )
    args = ap.parse_args()
    if args.time_scale <= 0:
        ap.error("--time-scale must be > 0 (see the module docstring)")
    concurrencies = args.concurrency or [1, 50, 200]

    log_dir = Path(tempfile.mkdtemp(prefix="loadgen-router-overhead-"))
    replicas = start_sim_replicas(
        2, profile=args.profile, time_scale=args.time_scale, seed=1, log_dir=log_dir, startup_timeout_s=60
    )
    routers = []
    try:
        replica_urls = [r.url for r in replicas]
        for kind in ROUTERS:
            routers.append(
                start_router(f"{kind}:{args.policy}", replica_urls, log_dir=log_dir, startup_timeout_s=60)
            )
        paths = [("direct", replica_urls, None)] + [
            (f"{r.identity.name} {r.identity.version}", [r.url], r.process.pid) for r in routers
        ]
        print(
            f"2 sim replicas ({args.profile}, time-scale {args.time_scale:g}), {args.max_tokens} tokens/request, "
            f"routers with policy {args.policy}; {args.duration:g} s window per point; times in ms (p50 / p99)"
            + ("; the client ACKs at once (TCP_QUICKACK)" if args.quickack else "")
        )
        header = (
            f"{'path':<22} {'streams':>7} {'requests':>8}  {'TTFT added':>15}  {'token delivery':>15}  "
            f"{'client ITL':>15}  {'sim ITL':>15}  {'chunks/s':>8}  {'router CPU':>10}  {'us/chunk':>8}"
        )
        print(header)
        print("-" * len(header))
        results = {}
        for streams in concurrencies:
            for name, urls, pid in paths:
                r = measure(name, urls, replica_urls, streams, args, pid)
                results[(name, streams)] = r
                cpu = "" if r["cpu_share"] is None else f"{r['cpu_share']:.0%}"
                per = "" if r["cpu_us_per_chunk"] is None else f"{r['cpu_us_per_chunk']:.1f}"
                print(
                    f"{name:<22} {streams:>7} {r['requests']:>8}  {_fmt(r['ttft_added'])}  {_fmt(r['delivery'])}  "
                    f"{_fmt(r['itl'])}  {_fmt(r['sim_itl'])}  {r['chunks_per_s']:>8,.0f}  {cpu:>10}  {per:>8}",
                    flush=True,
                )
        print("\nadded by the router (router minus direct; ms, p50 / p99)")
        for streams in concurrencies:
            base = results[("direct", streams)]
            for name, _, _ in paths[1:]:
                r = results[(name, streams)]
                d_ttft = (
                    r["ttft_added"][0] - base["ttft_added"][0],
                    r["ttft_added"][1] - base["ttft_added"][1],
                )
                d_tok = (r["delivery"][0] - base["delivery"][0], r["delivery"][1] - base["delivery"][1])
                print(f"{name:<22} {streams:>7}  TTFT {_fmt(d_ttft)}   token delivery {_fmt(d_tok)}")
    finally:
        stop_all([r.process for r in routers] + [r.process for r in replicas])


if __name__ == "__main__":
    main()
