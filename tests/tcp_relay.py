"""The TCP relay under the test proxies (``delay_proxy.py``, ``partition_proxy.py``): every byte read
from one side is written to the other, in order, once the proxy's ``hold`` lets it go.

``hold(read_at_s)`` is awaited before each piece is written, with the event loop's time at which
the piece was read: a delay sleeps to ``read_at_s + delay``, a partition waits for its link. The
reads go on meanwhile (into a queue), so what is held waits in the proxy, as it would in the
network, and neither side sees a reset. Run as scripts, the proxies import this module from their
own folder.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import BinaryIO

Hold = Callable[[float], Awaitable[None]]
READ_BYTES = 65536


async def pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, hold: Hold, record: BinaryIO | None = None
) -> None:
    """Relay ``reader`` to ``writer`` until end of file, each piece after ``hold``; with ``record``,
    every piece delivered is also appended there as it is written."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def deliver() -> None:
        while True:
            read_at_s, data = await queue.get()
            if not data:
                break
            await hold(read_at_s)
            if record is not None:
                record.write(data)
                record.flush()
            writer.write(data)
            await writer.drain()
        writer.close()

    task = asyncio.create_task(deliver())
    try:
        while True:
            data = await reader.read(READ_BYTES)
            queue.put_nowait((loop.time(), data))
            if not data:
                break
        await task
    except (ConnectionError, OSError):
        task.cancel()
        writer.close()


async def serve(
    upstream_port: int,
    hold: Hold,
    *,
    listen: tuple[str, int] = ("127.0.0.1", 0),
    upstream_host: str = "127.0.0.1",
    record: BinaryIO | None = None,
) -> None:
    """Accept on ``listen``, relay each connection both ways to the upstream through ``hold``
    (``record``: the bytes sent to the clients), print ``PORT <n>`` once listening, serve forever."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(upstream_host, upstream_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_writer, hold), pipe(up_reader, writer, hold, record))

    server = await asyncio.start_server(handle, *listen)
    print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()
