"""A TCP proxy on 127.0.0.1 that delivers every byte a fixed time after it came: a far target.

Run ``python tests/delay_proxy.py UPSTREAM_PORT DELAY_MS``; it prints ``PORT <n>`` once listening
and serves until killed. Each direction of each connection is delayed by ``DELAY_MS`` (so a round
trip through it takes twice that), in order. The kernel still accepts the TCP connection at once:
what the delay lengthens is every exchange above it, a TLS handshake included.
"""

from __future__ import annotations

import asyncio
import sys


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float) -> None:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def deliver() -> None:
        while True:
            t, data = await queue.get()
            if not data:
                break
            wait_s = t + delay_s - loop.time()
            if wait_s > 0:
                await asyncio.sleep(wait_s)
            writer.write(data)
            await writer.drain()
        writer.close()

    task = asyncio.create_task(deliver())
    try:
        while True:
            data = await reader.read(65536)
            queue.put_nowait((loop.time(), data))
            if not data:
                break
        await task
    except (ConnectionError, OSError):
        task.cancel()
        writer.close()


async def main(upstream_port: int, delay_s: float) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer, delay_s), _pipe(up_reader, writer, delay_s))

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), float(sys.argv[2]) / 1000.0))
