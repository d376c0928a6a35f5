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

from tcp_relay import serve


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

    async def hold(_read_at_s: float) -> None:
        await link_up.wait()

    await serve(upstream_port, hold)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
