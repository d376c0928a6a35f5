"""A TCP proxy on 127.0.0.1 whose link can be cut and healed: a network partition, on loopback.

Run ``python tests/partition_proxy.py UPSTREAM_PORT``; it prints ``PORT <n>`` once listening and
serves until killed. ``SIGUSR1`` cuts every connection (nothing is delivered either way; what is
sent meanwhile waits, as TCP's retransmissions make it wait in a real partition) and prints
``CUT <monotonic s>``; ``SIGUSR2`` heals it (what waited is delivered, in order) and prints
``HEALED <monotonic s>``. Connections stay open throughout: neither side sees a reset.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, link_up: asyncio.Event) -> None:
    queue: asyncio.Queue[bytes] = asyncio.Queue()

    async def deliver() -> None:
        while True:
            data = await queue.get()
            if not data:
                break
            await link_up.wait()
            writer.write(data)
            await writer.drain()
        writer.close()

    task = asyncio.create_task(deliver())
    try:
        while True:
            data = await reader.read(65536)
            queue.put_nowait(data)
            if not data:
                break
        await task
    except (ConnectionError, OSError):
        task.cancel()
        writer.close()


async def main(upstream_port: int) -> None:
    link_up = asyncio.Event()
    link_up.set()

    def cut() -> None:
        link_up.clear()
        print(f"CUT {time.monotonic():.3f}", flush=True)

    def heal() -> None:
        link_up.set()
        print(f"HEALED {time.monotonic():.3f}", flush=True)

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, cut)
    loop.add_signal_handler(signal.SIGUSR2, heal)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer, link_up), _pipe(up_reader, writer, link_up))

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
