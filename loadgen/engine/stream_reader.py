"""One greenlet reads every streaming reply body of a worker.

With a greenlet per stream, every chunk costs a wake-up of that greenlet: gevent tries the read,
gets ``EWOULDBLOCK``, starts the socket's watcher, switches to the hub and back, and reads again.
At hundreds of streams with tokens 10 ms apart that is most of a worker's CPU per chunk
(``bench/gevent_floor.py``: a bare loop doing only that and ``orjson.loads`` reads ~60,000-80,000
chunks per CPU-second; the same work in one greenlet over an epoll set ~110,000). So once a
reply's head is read, its socket is handed to the worker's ``StreamReader``: one greenlet waits on
one epoll set of every streaming socket, and for each socket the kernel says is readable reads what
came (``recvmsg`` with the kernel's receive stamp: in C, ``_reader.recv_stamped``, with the
compiled reader) and hands it to that stream's ``consume`` callback, right there, with no switch. The session's greenlet sleeps until its stream ends.

With the compiled reader the loop itself is C too (``_reader.Poller``: the epoll set, the reads
with their stamps and the calls of each stream's ``consume``, one call per round of ready
sockets); Python hears only of the streams that ended. The Python loop below is the reference
and the fallback (``LOADGEN_READER=python``); the tests run on both.

Level-triggered: a socket is in the set only while its body is being read, and leaves it when its
stream ends (or is abandoned), so a readable socket always has a reader. The greenlet exists only
while some stream is followed.
"""

from __future__ import annotations

import functools
import os
import socket
import time
from collections.abc import Callable

import gevent
from gevent import get_hub, monkey
from gevent.event import Event

from loadgen.engine.http_reply import READER, arrival_ns
from loadgen.engine.worker_gc import COLLECTOR

try:  # the compiled recvmsg with its stamp and read loop (loadgen/engine/_reader.c)
    from loadgen.engine._reader import Poller as _Poller
    from loadgen.engine._reader import recv_stamped as _c_recv_stamped
except ImportError:
    _c_recv_stamped = _Poller = None

__all__ = ["AVAILABLE", "StreamReader", "stream_reader"]


def _original_epoll() -> type | None:
    # gevent's monkey-patching (Locust applies it) removes select.epoll; the original stays.
    try:
        return monkey.get_original("select", "epoll")
    except AttributeError:
        return None


_epoll = _original_epoll()
# LOADGEN_STREAM_READER=0: each stream reads in its own greenlet (to compare, or to rule this out).
AVAILABLE = _epoll is not None and os.environ.get("LOADGEN_STREAM_READER", "1") != "0"
_EPOLLIN = 0x001
_ANC_SIZE = socket.CMSG_SPACE(16)  # one struct timespec
_MAX_EVENTS = 1024
YIELD_NS = 500_000  # the longest the reader keeps the other greenlets waiting while data streams in

# consume(data, arrival on the perf_counter clock, ns) -> True when the stream has ended (nothing
# more is to be read). It is given b"" once when the peer closed; following ends there whatever
# it returns.
Consume = Callable[[bytes, int], bool]
# read() -> (data, arrival ns): one non-blocking read of the socket, BlockingIOError when empty.
Read = Callable[[], tuple[bytes, int]]


def stamped_read(sock: socket.socket, block_size: int) -> Read:
    """One read of ``sock`` (a gevent socket) with its kernel receive stamp: compiled where the
    compiled reader is, else ``recvmsg`` and ``http_reply.arrival_ns``, the reference."""
    if _c_recv_stamped is not None and READER == "compiled":
        return functools.partial(_c_recv_stamped, sock.fileno(), block_size)
    recvmsg = sock._sock.recvmsg  # the non-blocking socket under gevent's

    def read() -> tuple[bytes, int]:
        data, anc, _flags, _addr = recvmsg(block_size, _ANC_SIZE)
        return data, arrival_ns(anc)

    return read


class _Followed:
    __slots__ = ("consume", "done", "error", "read")

    def __init__(self, read: Read | None, consume: Consume) -> None:
        self.read = read
        self.consume = consume
        self.done = Event()
        self.error: BaseException | None = None


class StreamReader:
    """The epoll set, the streams it follows, and the greenlet that reads them. ``compiled``: the
    loop in C (``_reader.Poller``); by default where the compiled reader is in use."""

    def __init__(self, compiled: bool | None = None) -> None:
        if compiled is None:
            compiled = _Poller is not None and READER == "compiled"
        elif compiled and _Poller is None:
            raise RuntimeError("the compiled stream reader is not built")
        self.compiled = compiled
        self._pid = os.getpid()
        self._poller = _Poller() if compiled else None
        self._epoll = None if compiled else _epoll()
        self._followed: dict[int, _Followed] = {}
        fileno = self._poller.fileno() if self._poller is not None else self._epoll.fileno()
        self._watcher = get_hub().loop.io(fileno, 1)
        self._greenlet: gevent.Greenlet | None = None

    def follow(self, sock: socket.socket, block_size: int, consume: Consume, raw: object = None) -> None:
        """Read ``sock`` into ``consume`` until it says the stream ended or raises (the exception
        is raised here, in the caller's greenlet). ``sock`` is a gevent socket; the caller's
        greenlet blocks until then. A ``gevent.Timeout`` or kill of the caller stops the
        following (the caller then closes the socket). ``raw``: the same consumer as the compiled
        poller's raw consumer (``_chat.ChatTaker.raw``), which it then calls instead, from its own
        buffer; the Python loop ignores it."""
        fd = sock.fileno()
        if self._poller is not None:
            f = _Followed(None, consume)
            self._poller.add(fd, block_size, consume, raw)
        else:
            f = _Followed(stamped_read(sock, block_size), consume)
            try:
                self._epoll.register(fd, _EPOLLIN)
            except FileExistsError:  # a closed socket's number, reused before it left the set
                self._epoll.modify(fd, _EPOLLIN)
        self._followed[fd] = f
        if self._greenlet is None:
            self._greenlet = gevent.spawn(self._run_compiled if self._poller is not None else self._run)
        try:
            f.done.wait()
        finally:
            if self._followed.get(fd) is f:  # not ended: timed out or killed while waiting
                self._forget(fd)
        if f.error is not None:
            raise f.error

    def _forget(self, fd: int) -> None:
        self._followed.pop(fd, None)
        if self._poller is not None:
            self._poller.remove(fd)
            return
        try:
            self._epoll.unregister(fd)
        except (OSError, ValueError):
            pass

    def _run_compiled(self) -> None:
        """The loop of ``_run`` with each round in one C call (``Poller.poll``): the same reads,
        the same yields every ``YIELD_NS``, the same ends."""
        followed = self._followed
        poll = self._poller.poll
        at_idle = COLLECTOR.at_idle
        wait = get_hub().wait
        perf_ns = time.perf_counter_ns
        yielded_ns = perf_ns()
        try:
            while followed:
                reads, ended = poll(YIELD_NS - (perf_ns() - yielded_ns))
                for fd, error in ended:  # the poller has let go of each already
                    f = followed.pop(fd, None)
                    if f is not None:
                        f.error = error
                        f.done.set()
                if not reads and not ended:
                    at_idle()  # nothing waits to be read: the time for a collection
                    wait(self._watcher)
                    yielded_ns = perf_ns()
                elif perf_ns() - yielded_ns >= YIELD_NS:
                    gevent.sleep(0)
                    yielded_ns = perf_ns()
        finally:
            self._greenlet = None

    def _run(self) -> None:
        followed = self._followed
        poll = self._epoll.poll
        at_idle = COLLECTOR.at_idle
        wait = get_hub().wait
        perf_ns = time.perf_counter_ns
        yielded_ns = perf_ns()
        try:
            while followed:
                events = poll(0, _MAX_EVENTS)
                if not events:
                    at_idle()  # nothing waits to be read: the time for a collection
                    wait(self._watcher)
                    yielded_ns = perf_ns()
                    continue
                # While data keeps coming this loop never waits: every YIELD_NS it lets the other
                # greenlets run (sessions starting, reports), within a round too (hundreds of
                # ready streams are milliseconds of reading). What a stream had ready then is
                # read after: the set is level-triggered and its data keeps its kernel stamp.
                for fd, _mask in events:
                    f = followed.get(fd)
                    if f is not None:
                        self._read(fd, f)
                    if perf_ns() - yielded_ns >= YIELD_NS:
                        gevent.sleep(0)
                        yielded_ns = perf_ns()
        finally:
            self._greenlet = None

    def _read(self, fd: int, f: _Followed) -> None:
        try:
            data, t_ns = f.read()
        except (BlockingIOError, InterruptedError):
            return
        except Exception as e:  # the connection failed: the stream's greenlet says how
            self._end(fd, f, e)
            return
        try:
            ended = f.consume(data, t_ns)
        except Exception as e:  # a bad chunk, a broken body, an adapter's error
            self._end(fd, f, e)
            return
        if ended or not data:  # at the socket's end nothing more can come, said or not
            self._end(fd, f, None)

    def _end(self, fd: int, f: _Followed, error: BaseException | None) -> None:
        self._forget(fd)
        f.error = error
        f.done.set()


_READERS: dict[int, StreamReader] = {}


def stream_reader() -> StreamReader:
    """This process's ``StreamReader`` (made anew in a forked child: an epoll set is shared
    across ``fork``)."""
    pid = os.getpid()
    r = _READERS.get(pid)
    if r is None:
        _READERS.clear()
        r = _READERS[pid] = StreamReader()
    return r
