"""How many streamed chunks the simulated engine serves per CPU-second (it must never be the bottleneck).

Starts one sim at ``--time-scale 0`` (no sleeping: steps run back to back) and, in a second
process, a lean asyncio client that keeps N streams open (one keep-alive connection each, a new
request as soon as one ends) and counts content chunks. Over the measurement window it reads the
sim process's CPU time from /proc (user + system) and prints:

  concurrency, chunks/s (wall), sim CPU share of one core, chunks per sim CPU-second

The figure that matters is the last: the sim's cost per chunk, whatever the client's speed.
Target: >= 20,000 chunks per sim CPU-second.

    .venv/bin/python bench/sim_capacity.py                  # 100 and 1,000 streams, 5 s each
    .venv/bin/python bench/sim_capacity.py -c 1000 -d 10
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from targets.sim.process import SimProcess

MARK = b'{"content":" '  # starts every content chunk's delta (the role chunk has none)
END = b"\r\n0\r\n\r\n"  # last chunk of a chunked HTTP body
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` (fields 14 and 15 of /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


# --- the client process ------------------------------------------------------------------------
async def _stream_forever(host: str, port: int, request: bytes, counts: list[int], stop: asyncio.Event) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while not stop.is_set():
            writer.write(request)
            tail = b""
            while True:
                data = await reader.read(262144)
                if not data:
                    return
                buf = tail + data
                counts[0] += buf.count(MARK) - tail.count(MARK)
                counts[1] += 1
                if END in buf:
                    break
                tail = buf[-32:]
    finally:
        writer.close()


async def _client(url: str, concurrency: int, warmup_s: float, duration_s: float, max_tokens: int) -> None:
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    counts = [0, 0]  # content chunks, socket reads
    stop = asyncio.Event()
    tasks = []
    for i in range(concurrency):
        body = orjson.dumps(
            {
                "model": "bench",
                "messages": [{"role": "user", "content": f"stream number {i} " + "word " * 40}],
                "max_tokens": max_tokens,
                "stream": True,
            }
        )
        request = (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % (host.encode(), len(body))
        ) + body
        tasks.append(asyncio.create_task(_stream_forever(host, int(port), request, counts, stop)))
    await asyncio.sleep(warmup_s)
    c0, r0, t0 = counts[0], counts[1], time.perf_counter()
    print("START", flush=True)
    await asyncio.sleep(duration_s)
    c1, r1, t1 = counts[0], counts[1], time.perf_counter()
    print("END " + orjson.dumps({"chunks": c1 - c0, "reads": r1 - r0, "wall_s": t1 - t0}).decode(), flush=True)
    stop.set()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


# --- the driver --------------------------------------------------------------------------------
def measure(sim: SimProcess, concurrency: int, warmup_s: float, duration_s: float, max_tokens: int) -> dict:
    client = subprocess.Popen(
        [sys.executable, __file__, "--client", sim.url, "-c", str(concurrency), "-w", str(warmup_s),
         "-d", str(duration_s), "--max-tokens", str(max_tokens)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = client.stdout.readline()
        if line.strip() != "START":
            raise RuntimeError(f"client failed: {line!r}")
        cpu0, t0 = cpu_seconds(sim.pid), time.perf_counter()
        line = client.stdout.readline()
        cpu1, t1 = cpu_seconds(sim.pid), time.perf_counter()
        if not line.startswith("END "):
            raise RuntimeError(f"client failed: {line!r}")
        result = orjson.loads(line[4:])
        client.wait(30)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
    sim_cpu_s = cpu1 - cpu0
    return {
        "concurrency": concurrency,
        "chunks": result["chunks"],
        "chunks_per_s": result["chunks"] / result["wall_s"],
        "sim_cpu_share": sim_cpu_s / (t1 - t0),
        "chunks_per_sim_cpu_s": result["chunks"] / sim_cpu_s if sim_cpu_s > 0 else float("inf"),
        "chunks_per_read": result["chunks"] / max(1, result["reads"]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("-c", "--concurrency", type=int, action="append", help="streams (repeatable; default 100 and 1000)")
    ap.add_argument("-d", "--duration", type=float, default=5.0, help="measurement window, s")
    ap.add_argument("-w", "--warmup", type=float, default=1.5, help="warm-up before the window, s")
    ap.add_argument("--max-tokens", type=int, default=256, help="tokens per request")
    ap.add_argument("--profile", default="h200-llama3-8b-fp8", help="sim profile (needs slots for every stream)")
    ap.add_argument("--client", metavar="URL", help=argparse.SUPPRESS)
    args = ap.parse_args()
    concurrencies = args.concurrency or [100, 1000]
    if args.client:
        asyncio.run(_client(args.client, concurrencies[0], args.warmup, args.duration, args.max_tokens))
        return

    sim = SimProcess.start(["--profile", args.profile, "--time-scale", "0"])
    try:
        print(f"sim {sim.url} (pid {sim.pid}), profile {args.profile}, time-scale 0, "
              f"{args.max_tokens} tokens/request, {args.duration:g} s window")
        print(f"{'streams':>8} {'chunks/s':>10} {'sim CPU':>8} {'chunks/sim-CPU-s':>17} {'chunks/read':>12}")
        for c in concurrencies:
            r = measure(sim, c, args.warmup, args.duration, args.max_tokens)
            print(f"{r['concurrency']:>8} {r['chunks_per_s']:>10,.0f} {r['sim_cpu_share']:>8.0%} "
                  f"{r['chunks_per_sim_cpu_s']:>17,.0f} {r['chunks_per_read']:>12.1f}", flush=True)
    finally:
        sim.stop()


if __name__ == "__main__":
    main()
