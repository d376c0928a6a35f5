"""A hostile OpenAI-compatible server for tests: raw asyncio on 127.0.0.1, byte-exact misbehaviour.

Run ``python tests/hostile_server.py [--tls CERT KEY] [--require-key-env NAME] [--log FILE]``; it prints ``PORT <n>`` once listening and
serves until killed (every misbehaviour is bounded in time too, so nothing it does outlives a
test by more than ``MAX_HOLD_S``). The first path segment picks the behaviour, so a client's base
URL selects it: ``http://127.0.0.1:<n>/<behaviour>`` + ``/v1/chat/completions``. ``GET
<prefix>/v1/models`` answers a model list for every behaviour.

=================  ==============================================================================
``ok``             a well-formed stream: role chunk, one chunk per token, usage, ``[DONE]``
``slowloris``      the status line, then one header byte every 0.1 s (headers never complete)
``silence``        complete headers, then nothing
``endless``        a token every 20 ms, never an end
``stall``          two tokens, then nothing
``throttle-K``     429 with ``Retry-After: 0.2`` for the first K tries of a request id, then ``ok``
``throttle-bare``  429 without ``Retry-After``
``throttle-long``  429 with ``Retry-After: 3600``
``startup-S``      503 with ``Retry-After: 1`` for S seconds after its first request, then ``ok``
``reset-N``        the ``ok`` response cut by a TCP reset after its first N bytes
``redirect``       307 to ``/ok/v1/chat/completions``
``gzip``           the ``ok`` stream gzip-compressed (``Content-Encoding: gzip``), flushed per event
``brotli``         a body that claims ``Content-Encoding: br``
``trailers``       the ``ok`` stream, chunked, ending with a trailer section
``http10``         the ``ok`` stream as an HTTP/1.0 close-delimited body
``hang``           a preflight request is ``ok``; every other gets complete headers, then nothing
``mixed``          per request id (``mixed_behaviour``): ok, throttle-1, stall, silence, slowloris or
                   HTTP 500; a preflight request (id ``loadgen-preflight-...``) is always ``ok``
``trickle``        complete SSE headers, then one body byte every 0.1 s, never a line end
``empty``          a role chunk, ``usage.completion_tokens: 0``, ``[DONE]``: no token at all
``empty-json``     a non-streaming chat body with ``content: ""`` and ``completion_tokens: 0``
``usage-K``        the ``ok`` stream whose usage says ``completion_tokens: K`` whatever was sent
``choices2``       two choices (``index`` 0 and 1) interleaved chunk by chunk, as ``n=2`` streams
``cr``             the ``ok`` stream with CR-only line ends (``\r``), as SSE allows
``bom``            the ``ok`` stream after a UTF-8 byte order mark
``multiline``      the ``ok`` stream with each token's JSON split over two ``data:`` lines of one
                   event, among ``:`` comments and ``event:``/``id:`` fields
=================  ==============================================================================

``ok`` streams ``max_tokens`` tokens (`` t0``, `` t1``, ...). With ``--require-key-env NAME``
every request must carry ``Authorization: Bearer $NAME`` (else 401); the header is never logged
or echoed.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import ssl
import struct
import sys
import time
import zlib

MAX_HOLD_S = 30.0  # the longest any behaviour keeps a connection busy
_tries: dict[str, int] = {}
_first_seen: dict[str, float] = {}
MIXED = (("ok", ""), ("throttle", "1"), ("stall", ""), ("silence", ""), ("slowloris", ""), ("fail", ""))
REQUIRED_AUTH: list[str] = []  # the Authorization value every request must carry, if any
REQUEST_LOG: list = []  # with --log FILE: the open file, one request id a line as each arrives


def mixed_behaviour(request_id: str) -> tuple[str, str]:
    """What ``mixed`` does with a request: (behaviour, argument), a stable function of its id."""
    if request_id.startswith("loadgen-preflight"):
        return "ok", ""
    return MIXED[zlib.crc32(request_id.encode()) % len(MIXED)]


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _event(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _delta(delta: dict | None, usage: dict | None = None) -> bytes:
    o: dict = {"id": "c", "object": "chat.completion.chunk", "model": "hostile-model"}
    o["choices"] = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": None}]
    if usage is not None:
        o["usage"] = usage
    return _event(o)


def ok_events(n: int) -> list[bytes]:
    """The SSE events of a well-formed reply of ``n`` tokens."""
    events = [_delta({"role": "assistant", "content": ""})]
    events += [_delta({"content": f" t{i}"}) for i in range(n)]
    events.append(_delta(None, {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": 5 + n}))
    events.append(b"data: [DONE]\n\n")
    return events


SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"


def _error(status: int, reason: str, extra: str = "") -> bytes:
    body = json.dumps({"error": {"message": f"hostile {reason}", "code": status}}).encode()
    return (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n{extra}"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def ok_response(n: int) -> bytes:
    return SSE_HEAD + b"\r\n" + b"".join(_chunk(e) for e in ok_events(n)) + b"0\r\n\r\n"


async def _write(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(data)
    await writer.drain()


async def _hold(writer: asyncio.StreamWriter, every_s: float, data: bytes | None = None) -> None:
    """Keep the connection busy (writing ``data`` every ``every_s``, or silent) up to MAX_HOLD_S."""
    end = time.monotonic() + MAX_HOLD_S
    while time.monotonic() < end:
        await asyncio.sleep(every_s)
        if data is not None:
            await _write(writer, data)


async def serve_request(name: str, arg: str, rid: str, n: int, writer: asyncio.StreamWriter) -> bool:
    """Answer one request as behaviour ``name``; True when the connection may carry another."""
    if name == "mixed":
        name, arg = mixed_behaviour(rid)
    if name == "hang":
        name = "ok" if rid.startswith("loadgen-preflight") else "silence"
    if name == "throttle" and arg.isdigit():
        tries = _tries[rid] = _tries.get(rid, 0) + 1
        if tries <= int(arg):
            await _write(writer, _error(429, "Too Many Requests", "Retry-After: 0.2\r\n"))
            return True
        name = "ok"
    started = _first_seen.setdefault(f"{name}-{arg}", time.monotonic())
    if name == "startup" and time.monotonic() - started < float(arg or 0):
        await _write(writer, _error(503, "Service Unavailable", "Retry-After: 1\r\n"))
        return True
    if name in ("ok", "startup"):
        await _write(writer, ok_response(n))
        return True
    if name == "fail":
        await _write(writer, _error(500, "Internal Server Error"))
        return True
    if name == "throttle" and arg == "bare":
        await _write(writer, _error(429, "Too Many Requests"))
        return True
    if name == "throttle" and arg == "long":
        await _write(writer, _error(429, "Too Many Requests", "Retry-After: 3600\r\n"))
        return True
    if name == "slowloris":
        await _write(writer, b"HTTP/1.1 200 OK\r\nX-Slow: ")
        await _hold(writer, 0.1, b"z")
        return False
    if name == "silence":
        await _write(writer, SSE_HEAD + b"\r\n")
        await _hold(writer, 1.0)
        return False
    if name == "endless":
        await _write(writer, SSE_HEAD + b"\r\n")
        await _hold(writer, 0.02, _chunk(_delta({"content": " more"})))
        return False
    if name == "stall":
        await _write(writer, SSE_HEAD + b"\r\n" + b"".join(_chunk(e) for e in ok_events(n)[:3]))
        await _hold(writer, 1.0)
        return False
    if name == "reset":
        await _write(writer, ok_response(n)[: int(arg)])
        await asyncio.sleep(0.05)  # let the bytes reach the client before the reset
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()
        return False
    if name == "redirect":
        await _write(
            writer,
            b"HTTP/1.1 307 Temporary Redirect\r\nLocation: /ok/v1/chat/completions\r\nContent-Length: 0\r\n\r\n",
        )
        return True
    if name == "gzip":
        z = zlib.compressobj(9, zlib.DEFLATED, 31)
        await _write(writer, SSE_HEAD + b"Content-Encoding: gzip\r\n\r\n")
        for e in ok_events(n):
            await _write(writer, _chunk(z.compress(e) + z.flush(zlib.Z_SYNC_FLUSH)))
        await _write(writer, _chunk(z.flush()) + b"0\r\n\r\n")
        return True
    if name == "brotli":
        await _write(writer, SSE_HEAD + b"Content-Encoding: br\r\n\r\n" + _chunk(b"\x1b\x03\x00") + b"0\r\n\r\n")
        return True
    if name == "trailers":
        body = ok_response(n)[: -len(b"0\r\n\r\n")]
        await _write(writer, body + b"0\r\nX-Checksum: 1234\r\nX-Done: yes\r\n\r\n")
        return True
    if name == "tail":
        # A whole reply, then, after its end marker and before the body's end, a comment line
        # of ``arg`` bytes: past a client's line limit, the drain fails, not the reply.
        # The line's start and its end go apart, so the client holds a part of it.
        await _write(writer, SSE_HEAD + b"\r\n" + b"".join(_chunk(e) for e in ok_events(n)))
        await _write(writer, _chunk(b": " + b"x" * int(arg or 100)))
        await asyncio.sleep(0.05)
        await _write(writer, _chunk(b"\n") + b"0\r\n\r\n")
        return True
    if name == "http10":
        head = b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"
        await _write(writer, head + b"".join(ok_events(n)))
        return False
    if name == "trickle":
        await _write(writer, SSE_HEAD + b"\r\n")
        await _hold(writer, 0.1, _chunk(b"d"))
        return False
    if name == "empty" and not arg:
        await _write(writer, SSE_HEAD + b"\r\n" + b"".join(_chunk(e) for e in ok_events(0)) + b"0\r\n\r\n")
        return True
    if name == "empty" and arg == "json":
        doc = {
            "id": "c",
            "object": "chat.completion",
            "model": "hostile-model",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": ""}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 0, "total_tokens": 5},
        }
        payload = json.dumps(doc).encode()
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(payload)
        await _write(writer, head + payload)
        return True
    if name == "usage" and arg.isdigit():
        events = ok_events(n)
        events[-2] = _delta(None, {"prompt_tokens": 5, "completion_tokens": int(arg), "total_tokens": 5 + int(arg)})
        await _write(writer, SSE_HEAD + b"\r\n" + b"".join(_chunk(e) for e in events) + b"0\r\n\r\n")
        return True
    if name == "choices2":
        events = [_choice(i, {"role": "assistant", "content": ""}) for i in (0, 1)]
        for t in range(n):
            events += [_choice(i, {"content": f" c{i}t{t}"}) for i in (0, 1)]
        events.append(_delta(None, {"prompt_tokens": 5, "completion_tokens": 2 * n, "total_tokens": 5 + 2 * n}))
        events.append(b"data: [DONE]\n\n")
        await _write(writer, SSE_HEAD + b"\r\n" + b"".join(_chunk(e) for e in events) + b"0\r\n\r\n")
        return True
    if name in ("cr", "bom", "multiline"):
        events = ok_events(n)
        if name == "cr":
            events = [e.replace(b"\n", b"\r") for e in events]
        elif name == "bom":
            events[0] = b"\xef\xbb\xbf" + events[0]
        else:
            events = [_multiline(e, i) for i, e in enumerate(events)]
        await _write(writer, SSE_HEAD + b"\r\n" + b"".join(_chunk(e) for e in events) + b"0\r\n\r\n")
        return True
    await _write(writer, _error(404, "Not Found"))
    return True


def _choice(index: int, delta: dict) -> bytes:
    o = {"id": "c", "object": "chat.completion.chunk", "model": "hostile-model"}
    o["choices"] = [{"index": index, "delta": delta, "finish_reason": None}]
    return _event(o)


def _multiline(event: bytes, i: int) -> bytes:
    """``event`` (``data: {json}\\n\\n``) as SSE also allows it: its JSON split over two ``data:``
    lines, a comment and ``event:``/``id:`` fields in the same event."""
    payload = event[len(b"data: ") : -2]
    if not payload.startswith(b"{"):
        return b": done next\n" + event
    cut = payload.index(b'"choices"')
    return b"event: message\n: split json\ndata: " + payload[:cut] + b"\nid: %d\ndata:" % i + payload[cut:] + b"\n\n"


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), MAX_HOLD_S)
            lines = head.decode("latin-1").split("\r\n")
            method, target, _ = lines[0].split(" ", 2)
            headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            prefix, _, path = target.lstrip("/").partition("/")
            name, _, arg = prefix.partition("-")
            if method == "GET" and path.startswith("v1/models"):
                doc = {"object": "list", "data": [{"id": "hostile-model", "object": "model", "owned_by": "hostile"}]}
                payload = json.dumps(doc).encode()
                await _write(
                    writer,
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                    % (len(payload), payload),
                )
                continue
            if REQUIRED_AUTH and headers.get("authorization") != REQUIRED_AUTH[0]:
                await _write(writer, _error(401, "Unauthorized"))
                continue
            if method != "POST":
                await _write(writer, _error(404, "Not Found"))
                continue
            n = int(json.loads(body or b"{}").get("max_tokens") or 4)
            rid = headers.get("x-request-id", "")
            if REQUEST_LOG:
                REQUEST_LOG[0].write(rid + "\n")
                REQUEST_LOG[0].flush()
            if not await serve_request(name, arg, rid, n, writer):
                break
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, TimeoutError, ValueError):
        pass
    finally:
        writer.close()


async def main(argv: list[str]) -> None:
    ctx = None
    if "--tls" in argv:
        i = argv.index("--tls")
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(argv[i + 1], argv[i + 2])
    if "--require-key-env" in argv:
        REQUIRED_AUTH.append("Bearer " + os.environ[argv[argv.index("--require-key-env") + 1]])
    if "--log" in argv:
        REQUEST_LOG.append(open(argv[argv.index("--log") + 1], "a"))  # noqa: SIM115 (open while serving)
    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ctx)
    print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
