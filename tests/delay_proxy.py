"""A TCP proxy that delivers every byte a fixed time after it came: a far target, or a far master.

Run ``python tests/delay_proxy.py UPSTREAM_PORT DELAY_MS``; it prints ``PORT <n>`` once listening
and serves until killed. Each direction of each connection is delayed by ``DELAY_MS`` (so a round
trip through it takes twice that), in order. The kernel still accepts the TCP connection at once:
what the delay lengthens is every exchange above it, a TLS handshake included.

Options (for hosts in network namespaces, tests/netns.py): ``--listen HOST:PORT`` (default
127.0.0.1:0, port 0 picks one), ``--upstream-host HOST`` (default 127.0.0.1), and
``--record FILE``: every byte delivered to the clients is appended to FILE as it is written, so a
test can read what a peer was sent (ZeroMQ frames carry their messages' bytes as they are).
"""

from __future__ import annotations

import argparse
import asyncio
from typing import BinaryIO

from tcp_relay import serve


async def main(
    upstream_port: int,
    delay_s: float,
    *,
    listen: tuple[str, int] = ("127.0.0.1", 0),
    upstream_host: str = "127.0.0.1",
    record: BinaryIO | None = None,
) -> None:
    loop = asyncio.get_running_loop()

    async def hold(read_at_s: float) -> None:
        wait_s = read_at_s + delay_s - loop.time()
        if wait_s > 0:
            await asyncio.sleep(wait_s)

    await serve(upstream_port, hold, listen=listen, upstream_host=upstream_host, record=record)


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT; use e.g. 10.77.0.2:6000")
    return host, int(port)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Delay every byte of every TCP connection to an upstream port.")
    parser.add_argument("upstream_port", type=int)
    parser.add_argument("delay_ms", type=float, help="delay of each direction, milliseconds")
    parser.add_argument("--listen", type=_host_port, default=("127.0.0.1", 0), help="HOST:PORT to accept on")
    parser.add_argument("--upstream-host", default="127.0.0.1")
    parser.add_argument("--record", default=None, help="append every byte sent to the clients to this file")
    args = parser.parse_args()
    record_file = open(args.record, "ab") if args.record else None  # noqa: SIM115 - open until killed
    asyncio.run(
        main(args.upstream_port, args.delay_ms / 1000.0, listen=args.listen, upstream_host=args.upstream_host, record=record_file)
    )
