"""Does the kernel's receive stamp agree with this process's wall clock? Checked once a process.

A token's arrival is the kernel's ``SO_TIMESTAMPNS`` stamp (``CLOCK_REALTIME``, taken by the
kernel) converted with ``time.time_ns()`` (the same clock, read by this process). The two agree on
any real host. They do not where the process's wall clock is shifted under it (libfaketime and
other ``LD_PRELOAD`` clock shims, some sandboxes): every token time would then move by the shift,
and TTFT could come out negative and still be recorded as fine. So before the first stamped read
the process sends itself one datagram on loopback and compares its stamp with the wall clock read
around it; where they disagree by more than ``TOLERANCE_NS`` the client reads without kernel
stamps (the return of each ``recv``, as on TLS), and says so once.
"""

from __future__ import annotations

import functools
import logging
import socket
import struct
import time

log = logging.getLogger("loadgen")

TOLERANCE_NS = 5_000_000  # a scheduling pause between the reads is well under this; a shim is not
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
_ANC_SIZE = socket.CMSG_SPACE(16) if hasattr(socket, "CMSG_SPACE") else 0


def stamp_offset_ns() -> int | None:
    """How far the kernel's stamp of a datagram lies outside the wall-clock reads around it (ns,
    0 when inside); None where no stamp can be had (no ``recvmsg``, no loopback UDP)."""
    if not _ANC_SIZE:
        return None
    try:
        rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    except OSError:
        return None
    try:
        rx.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
        rx.bind(("127.0.0.1", 0))
        rx.settimeout(1.0)
        before = time.time_ns()
        tx.sendto(b"t", rx.getsockname())
        _, anc, _, _ = rx.recvmsg(16, _ANC_SIZE)
        after = time.time_ns()
    except OSError:
        return None
    finally:
        rx.close()
        tx.close()
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(payload) >= 16:
            sec, nsec = struct.unpack_from("qq", payload)
            stamp = sec * 1_000_000_000 + nsec
            return before - stamp if stamp < before else max(0, stamp - after)
    return None


@functools.cache
def kernel_stamps_agree() -> bool:
    """True where kernel receive stamps can be converted with this process's wall clock."""
    offset = stamp_offset_ns()
    if offset is None:
        return True  # no stamps to be had: the caller finds that out by itself
    if offset > TOLERANCE_NS:
        log.warning(
            "kernel receive stamps are off: the kernel's clock and this process's wall clock differ by %.1f ms "
            "(a clock shim such as libfaketime?); token times are taken when each read returns",
            offset / 1e6,
        )
        return False
    return True
