"""The streaming client against real servers on 127.0.0.1.

The servers run in a subprocess (``python <this file> serve``) so their timing does not share a
GIL with the client under test: an aiohttp app for well-formed HTTP, plus a raw asyncio server
that writes byte-exact responses (chunk-size lines split across TCP writes, close-delimited
bodies, idle connections closed by the server). Both log, per request id, the
``perf_counter_ns()`` taken right before writing the bytes that complete each token line;
CLOCK_MONOTONIC is system-wide on Linux, so the client's timestamps compare directly.

Other ``test_client_*``/``test_replay_*`` modules import ``start_servers`` from here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

TRANSCRIPTS = Path(__file__).resolve().parent.parent / "fixtures" / "transcripts"

# Timing margins, generous for 2 shared cores: a token line must be seen no earlier than the
# server wrote it and no later than this after. Token gaps in these tests are >= 40 ms, so a
# client that buffered lines (the 1-4 KiB iter_content failure) would miss by >= 40 ms.
LATE_MARGIN_NS = 20_000_000
MEDIAN_MARGIN_NS = 5_000_000


# ================================================================================================
# The servers (subprocess side)
# ================================================================================================


def _serve() -> None:  # pragma: no cover - runs in the server subprocess
    import asyncio

    from aiohttp import web

    perf = time.perf_counter_ns
    log: dict[str, dict] = {}

    def chat_chunk(delta: dict | None, *, usage: dict | None = None, finish: str | None = None) -> bytes:
        o: dict = {"id": "chatcmpl-test", "object": "chat.completion.chunk", "created": 1, "model": "m"}
        o["choices"] = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
        if usage is not None:
            o["usage"] = usage
        return b"data: " + json.dumps(o, separators=(",", ":")).encode()

    def token_line(i: int) -> bytes:
        return chat_chunk({"content": f" w{i}"})

    def usage_line(n: int) -> bytes:
        return chat_chunk(
            None,
            usage={
                "prompt_tokens": 7,
                "completion_tokens": n,
                "total_tokens": 7 + n,
                "prompt_tokens_details": {"cached_tokens": 3},
            },
        )

    def new_log(rid: str, peer: int, scenario: str, body: dict | None, headers: dict) -> dict:
        entry = log[rid] = {"peer": peer, "scenario": scenario, "writes": [], "events": [], "body": body}
        entry["headers"] = headers
        return entry

    # ---- aiohttp app ---------------------------------------------------------------------------

    identity = {
        ("vllm", "v1/models"): {
            "object": "list",
            "data": [
                {
                    "id": "meta-llama/Llama-3.1-8B-Instruct",
                    "object": "model",
                    "created": 1,
                    "owned_by": "vllm",
                    "root": "meta-llama/Llama-3.1-8B-Instruct",
                    "max_model_len": 8192,
                }
            ],
        },
        ("vllm", "version"): {"version": "0.8.5"},
        ("llama", "v1/models"): {
            "object": "list",
            "data": [{"id": "qwen2.5-0.5b-instruct-q4_k_m.gguf", "object": "model", "owned_by": "llamacpp"}],
        },
        ("llama", "props"): {
            "total_slots": 4,
            "model_path": "/cache/models/qwen2.5-0.5b-instruct-q4_k_m.gguf",
            "build_info": "b4567-1a2b3c4d",
            "chat_template": "{% for m in messages %}...{% endfor %}",
        },
        ("sglang", "v1/models"): {
            "object": "list",
            "data": [{"id": "meta-llama/Llama-3.1-8B-Instruct", "object": "model", "owned_by": "sglang"}],
        },
        ("sglang", "get_model_info"): {
            "model_path": "meta-llama/Llama-3.1-8B-Instruct",
            "is_generation": True,
        },
        ("sglang", "get_server_info"): {
            "version": "0.4.6.post1",
            "tp_size": 1,
            "max_total_num_tokens": 500000,
        },
    }

    async def handle_get(request: web.Request) -> web.StreamResponse:
        scenario, tail = request.match_info["scenario"], request.match_info["tail"]
        if scenario == "_log":
            return web.json_response(log.get(tail))
        if scenario == "slow":
            await asyncio.sleep(30)
        doc = identity.get((scenario, tail))
        if doc is None:
            raise web.HTTPNotFound()
        return web.json_response(doc)

    streaming = {"ok", "close", "stall", "cut", "nodone", "malformed", "inband-error", "replay"}

    async def handle_post(request: web.Request) -> web.StreamResponse:
        scenario = request.match_info["scenario"]
        if scenario.startswith("http-"):  # a fixed status, whatever the body says
            return web.Response(status=int(scenario[5:]), text='{"error": {"message": "no way"}}')
        if scenario not in streaming and scenario not in ("status", "json"):
            raise web.HTTPNotFound()
        raw = await request.read()
        body = json.loads(raw) if raw else None
        params = (body or {}).get("test", {}) if isinstance(body, dict) else {}
        rid = request.headers.get("X-Request-ID", "")
        peer = request.transport.get_extra_info("peername")[1]
        entry = new_log(rid, peer, scenario, body, dict(request.headers))
        n = int(params.get("tokens", 5))
        delay = float(params.get("delay_ms", 20)) / 1000
        split = bool(params.get("split", False))
        coalesce = bool(params.get("coalesce", False))

        if scenario == "status":
            headers = {}
            if "retry_after" in params:
                headers["Retry-After"] = str(params["retry_after"])
            return web.Response(
                status=int(params["status"]),
                text=params.get("text", "error"),
                headers=headers,
                content_type="application/json",
            )
        if scenario == "json":
            return web.json_response(
                {
                    "id": "chatcmpl-1",
                    "object": "chat.completion",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": " a b c"}}],
                    "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
                }
            )

        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        if scenario == "close":
            resp.force_close()
        await resp.prepare(request)

        async def send(line: bytes, token: bool) -> None:
            data = line + b"\n\n"
            if split:
                # The line crosses three writes (three HTTP chunks, separate TCP segments);
                # it is complete when the last piece, holding its newline, is written.
                a, b = 6, len(line) // 2
                await resp.write(data[:a])
                await asyncio.sleep(0.004)
                await resp.write(data[a:b])
                await asyncio.sleep(0.004)
                t = perf()
                await resp.write(data[b:])
            else:
                t = perf()
                await resp.write(data)
            if token:
                entry["writes"].append(t)

        if scenario == "replay":
            name = request.match_info["tail"].split("/")[0]
            events = (TRANSCRIPTS / name).read_bytes().split(b"\n\n")
            for ev in events:
                if not ev.strip():
                    continue
                await asyncio.sleep(delay)
                t = perf()
                await resp.write(ev + b"\n\n")
                entry["events"].append(t)
            return resp

        await send(chat_chunk({"role": "assistant", "content": ""}), False)
        if scenario == "stall":
            await asyncio.sleep(30)
            return resp
        i = 0
        while i < n:
            await asyncio.sleep(delay)
            if coalesce and i + 1 < n and i % 3 == 1:
                t = perf()
                await resp.write(token_line(i) + b"\n\n" + token_line(i + 1) + b"\n\n")
                entry["writes"] += [t, t]
                i += 2
                continue
            await send(token_line(i), True)
            i += 1
            if scenario == "malformed" and i == 2:
                await resp.write(b'data: {"choices": [{"delta": \n\n')
            if scenario == "cut" and i == 3:
                request.transport.abort()
                return resp
            if scenario == "inband-error" and i == 2:
                err = {"error": {"message": "engine overloaded", "type": "ServiceUnavailable", "code": 503}}
                await resp.write(b"data: " + json.dumps(err).encode() + b"\n\ndata: [DONE]\n\n")
                return resp
        if scenario == "nodone":
            return resp
        await send(usage_line(n), False)
        await resp.write(b"data: [DONE]\n\n")
        return resp

    # ---- raw server: byte-exact responses ------------------------------------------------------

    def sse_body(n: int) -> tuple[bytes, list[int]]:
        """The SSE body and, per token line, the offset of its newline."""
        out, ends = bytearray(), []
        out += chat_chunk({"role": "assistant", "content": ""}) + b"\n\n"
        for i in range(n):
            line = token_line(i)
            ends.append(len(out) + len(line))
            out += line + b"\n\n"
        out += usage_line(n) + b"\n\ndata: [DONE]\n\n"
        return bytes(out), ends

    def chunked(body: bytes, size: int) -> tuple[bytes, list[int]]:
        """Chunked encoding with ``size``-byte chunks; wire offset of every body byte."""
        wire, where = bytearray(), []
        for start in range(0, len(body), size):
            piece = body[start : start + size]
            wire += b"%x\r\n" % len(piece)
            for k in range(len(piece)):
                where.append(len(wire) + k)
            wire += piece + b"\r\n"
        wire += b"0\r\n\r\n"
        return bytes(wire), where

    async def raw_handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")[1]
        served = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                path = lines[0].split()[1]
                headers = {
                    k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ln)
                }
                raw = await reader.readexactly(int(headers.get("content-length", "0")))
                body = json.loads(raw) if raw else {}
                params = body.get("test", {})
                rid = headers.get("x-request-id", "")
                scenario = path.strip("/").split("/")[0]
                entry = new_log(rid, peer, scenario, body, headers)
                n = int(params.get("tokens", 6))
                delay = float(params.get("delay_ms", 40)) / 1000
                sse, ends = sse_body(n)
                if scenario == "raw-reset" or (scenario == "raw-drop-reuse" and served > 0):
                    # raw-drop-reuse: a kept connection dies as the next request arrives
                    writer.transport.abort()
                    return
                served += 1
                if scenario == "raw-close":
                    # Close-delimited body: no length, no chunking; the end of the body is EOF.
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
                    )
                    pos = 0
                    for end in ends:
                        await asyncio.sleep(delay)
                        entry["writes"].append(perf())
                        writer.write(sse[pos : end + 1])
                        pos = end + 1
                    writer.write(sse[pos:])
                    await writer.drain()
                    writer.close()
                    return
                if scenario == "raw-length":
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n"
                        % len(sse)
                    )
                    pos = 0
                    for end in ends:
                        await asyncio.sleep(delay)
                        entry["writes"].append(perf())
                        writer.write(sse[pos : end + 1])
                        pos = end + 1
                    writer.write(sse[pos:])
                    await writer.drain()
                    continue
                # raw-chunked / raw-idle-close: 5-byte chunks; TCP writes of 7 bytes cut through
                # chunk-size lines, CRLFs and data alike.
                wire, where = chunked(sse, 5)
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                )
                step = 7
                completing = {where[e] // step for e in ends}  # writes that complete a token line
                for w in range(0, (len(wire) + step - 1) // step):
                    if w in completing:
                        await asyncio.sleep(delay)
                        entry["writes"].append(perf())
                    elif w % 3 == 0:
                        await asyncio.sleep(0.002)
                    writer.write(wire[w * step : (w + 1) * step])
                await writer.drain()
                if scenario == "raw-idle-close":
                    await asyncio.sleep(0.05)
                    writer.close()
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/{scenario}/{tail:.*}", handle_get)
        app.router.add_post("/{scenario}/{tail:.*}", handle_post)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        http_port = site._server.sockets[0].getsockname()[1]
        raw = await asyncio.start_server(raw_handler, "127.0.0.1", 0)
        raw_port = raw.sockets[0].getsockname()[1]
        print(f"PORTS {http_port} {raw_port}", flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


# ================================================================================================
# Test side
# ================================================================================================


@dataclass
class Servers:
    http: str  # aiohttp base URL
    raw: str  # raw asyncio server base URL
    proc: subprocess.Popen

    def log(self, request_id: str) -> dict:
        with urllib.request.urlopen(f"{self.http}/_log/{request_id}", timeout=5) as r:
            return json.loads(r.read())


def start_servers() -> Servers:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    # A file, not a pipe: a full pipe would block the server. Open for the server's lifetime.
    errors = tempfile.TemporaryFile()  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, __file__, "serve"], stdout=subprocess.PIPE, stderr=errors, env=env, text=True
    )
    line = proc.stdout.readline()
    if not line.startswith("PORTS"):
        proc.kill()
        errors.seek(0)
        raise RuntimeError(f"test server did not start: {line!r} {errors.read()[-2000:]!r}")
    _, http_port, raw_port = line.split()
    return Servers(f"http://127.0.0.1:{http_port}", f"http://127.0.0.1:{raw_port}", proc)


def stop_servers(servers: Servers) -> None:
    servers.proc.terminate()
    try:
        servers.proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        servers.proc.kill()


@pytest.fixture(scope="module")
def servers():
    s = start_servers()
    yield s
    stop_servers(s)


_counter = iter(range(1_000_000))


def chat(max_tokens: int = 5, *, stream: bool = True, session: str = "sess-1", **test):
    """A chat request whose ``test`` body field tells the scripted server what to do."""
    from targets.adapters.base import ChatRequest

    return ChatRequest(
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=max_tokens,
        session_id=session,
        request_id=f"req-{os.getpid()}-{next(_counter)}",
        stream=stream,
        extra_body={"test": test} if test else None,
    )


def run(base: str, scenario: str, req, *, deadline_s: float = 10.0, conn=None, adapter=None):
    from loadgen.engine.client import SessionConnection
    from targets.adapters.openai import OpenAIChatAdapter

    adapter = adapter or OpenAIChatAdapter()
    own = conn is None
    conn = conn or SessionConnection(f"{base}/{scenario}")
    try:
        return conn.stream(adapter.build_request(req), adapter, deadline_s=deadline_s)
    finally:
        if own:
            conn.close()


def assert_on_time(client_ns: list[int], server_ns: list[int]) -> None:
    assert len(client_ns) == len(server_ns)
    lags = [c - s for c, s in zip(client_ns, server_ns, strict=True)]
    assert min(lags) >= 0, f"a token was seen before the server wrote it: {lags}"
    assert max(lags) < LATE_MARGIN_NS, f"token seen {max(lags) / 1e6:.1f} ms after it was written: {lags}"
    assert sorted(lags)[len(lags) // 2] < MEDIAN_MARGIN_NS, lags


# ---- timing fidelity ---------------------------------------------------------------------------


def test_token_timestamps_match_server_write_times(servers):
    req = chat(8, tokens=8, delay_ms=40)
    res = run(servers.http, "ok", req)
    assert res.ok, res.error_message
    log = servers.log(req.request_id)
    assert res.chunk_tokens == [1] * 8
    assert_on_time(res.chunk_ns, log["writes"])
    assert res.t_first_ns == res.chunk_ns[0]
    assert res.t_send_ns < res.t_first_ns <= res.chunk_ns[-1] <= res.t_end_ns
    # The role-only first chunk (written before the 40 ms wait) is not the first token.
    assert res.t_first_ns - res.t_send_ns >= 35_000_000
    assert res.text == "".join(f" w{i}" for i in range(8))
    assert (res.usage.prompt_tokens, res.usage.completion_tokens, res.usage.cached_tokens) == (7, 8, 3)


def test_lines_split_across_writes_and_http_chunks(servers):
    req = chat(6, tokens=6, delay_ms=40, split=True)
    res = run(servers.http, "ok", req)
    assert res.ok, res.error_message
    assert res.text == "".join(f" w{i}" for i in range(6))
    assert_on_time(res.chunk_ns, servers.log(req.request_id)["writes"])


def test_two_lines_in_one_segment_share_their_arrival_time(servers):
    req = chat(8, tokens=8, delay_ms=40, coalesce=True)
    res = run(servers.http, "ok", req)
    assert res.ok, res.error_message
    assert len(res.chunk_ns) == 8
    assert_on_time(res.chunk_ns, servers.log(req.request_id)["writes"])
    assert res.chunk_ns[1] == res.chunk_ns[2]  # written together: same recv, same timestamp


def test_chunk_size_lines_split_across_tcp_writes(servers):
    req = chat(6, tokens=6, delay_ms=40)
    res = run(servers.raw, "raw-chunked", req)
    assert res.ok, res.error_message
    assert res.text == "".join(f" w{i}" for i in range(6))
    assert res.usage.completion_tokens == 6
    assert_on_time(res.chunk_ns, servers.log(req.request_id)["writes"])


def test_content_length_body(servers):
    req = chat(4, tokens=4, delay_ms=40)
    res = run(servers.raw, "raw-length", req)
    assert res.ok, res.error_message
    assert_on_time(res.chunk_ns, servers.log(req.request_id)["writes"])


def test_close_delimited_body_is_complete_and_not_reused(servers):
    from loadgen.engine.client import SessionConnection

    with SessionConnection(f"{servers.raw}/raw-close") as conn:
        for _ in range(2):
            req = chat(4, tokens=4, delay_ms=40)
            res = run(servers.raw, "raw-close", req, conn=conn)
            assert res.ok, res.error_message
            assert_on_time(res.chunk_ns, servers.log(req.request_id)["writes"])
        assert conn.connections_opened == 2


# ---- connections -------------------------------------------------------------------------------


def test_one_keep_alive_connection_per_session(servers):
    from loadgen.engine.client import SessionConnection

    with SessionConnection(f"{servers.http}/ok") as conn:
        reqs = [chat(3, tokens=3, delay_ms=5) for _ in range(4)]
        results = [run(servers.http, "ok", r, conn=conn) for r in reqs]
    assert all(r.ok for r in results), [r.error_message for r in results]
    assert conn.connections_opened == 1
    assert [r.reused_connection for r in results] == [False, True, True, True]
    assert len({servers.log(r.request_id)["peer"] for r in reqs}) == 1


def test_keep_alive_over_raw_chunked(servers):
    from loadgen.engine.client import SessionConnection

    with SessionConnection(f"{servers.raw}/raw-chunked") as conn:
        reqs = [chat(3, tokens=3, delay_ms=1) for _ in range(3)]
        results = [run(servers.raw, "raw-chunked", r, conn=conn) for r in reqs]
    assert all(r.ok for r in results), [r.error_message for r in results]
    assert conn.connections_opened == 1


def test_reconnects_when_server_closed_between_turns(servers):
    from loadgen.engine.client import SessionConnection

    with SessionConnection(f"{servers.raw}/raw-idle-close") as conn:
        first = run(servers.raw, "raw-idle-close", chat(3, tokens=3, delay_ms=1), conn=conn)
        time.sleep(0.3)  # the server closes the idle connection after 50 ms
        second = run(servers.raw, "raw-idle-close", chat(3, tokens=3, delay_ms=1), conn=conn)
    assert first.ok and second.ok, (first.error_message, second.error_message)
    assert conn.connections_opened == 2
    assert second.reused_connection is False


def test_request_retried_once_when_a_kept_connection_dies_on_send(servers):
    from loadgen.engine.client import SessionConnection

    with SessionConnection(f"{servers.raw}/raw-drop-reuse") as conn:
        first = run(servers.raw, "raw-drop-reuse", chat(2, tokens=2, delay_ms=1), conn=conn)
        second = run(servers.raw, "raw-drop-reuse", chat(2, tokens=2, delay_ms=1), conn=conn)
    assert first.ok and second.ok, (first.error_message, second.error_message)
    assert conn.connections_opened == 2 and not second.reused_connection


def test_connection_close_header_is_honoured(servers):
    from loadgen.engine.client import SessionConnection

    with SessionConnection(f"{servers.http}/close") as conn:
        results = [run(servers.http, "close", chat(2, tokens=2, delay_ms=1), conn=conn) for _ in range(2)]
    assert all(r.ok for r in results)
    assert conn.connections_opened == 2


# ---- failures are data ---------------------------------------------------------------------------


def test_deadline_is_per_request_not_per_read(servers):
    from loadgen.engine.client import SessionConnection

    with SessionConnection(f"{servers.http}/ok") as conn:
        t0 = time.monotonic()
        res = run(servers.http, "ok", chat(1000, tokens=1000, delay_ms=100), deadline_s=0.5, conn=conn)
        elapsed = time.monotonic() - t0
        assert res.error_category == "timeout"
        assert "0.5 s" in res.error_message
        assert 0.45 < elapsed < 1.5  # tokens kept coming every 100 ms, yet the request ended
        assert 2 <= len(res.chunk_ns) <= 5
        assert res.text.startswith(" w0")
        again = run(servers.http, "ok", chat(2, tokens=2, delay_ms=1), conn=conn)
    assert again.ok and not again.reused_connection  # the timed-out connection was discarded


def test_stall_times_out(servers):
    res = run(servers.http, "stall", chat(5), deadline_s=0.3)
    assert res.error_category == "timeout"
    assert res.t_first_ns is None and res.chunk_ns == []


def test_http_500_keeps_the_connection(servers):
    from loadgen.engine.client import SessionConnection

    with SessionConnection(f"{servers.http}/status") as conn:
        body = '{"error": {"message": "boom", "code": 500}}\nsecond line'
        res = run(servers.http, "status", chat(status=500, text=body), conn=conn)
        assert res.error_category == "http_5xx"
        assert res.http_status == 500
        assert res.error_message == 'HTTP 500: {"error": {"message": "boom", "code": 500}}'
        again = run(servers.http, "status", chat(status=400, text="bad request"), conn=conn)
    assert again.error_category == "http_4xx" and again.error_message == "HTTP 400: bad request"
    assert again.reused_connection and conn.connections_opened == 1


def test_http_429_with_retry_after(servers):
    res = run(servers.http, "status", chat(status=429, retry_after=3, text="queue full"))
    assert res.error_category == "http_429"
    assert res.retry_after_s == 3.0
    assert res.error_message == "HTTP 429: queue full"


def test_mid_stream_close_is_stream_cut(servers):
    res = run(servers.http, "cut", chat(10, tokens=10, delay_ms=5))
    assert res.error_category == "stream_cut"
    assert len(res.chunk_ns) == 3 and res.text == " w0 w1 w2"


def test_stream_without_end_marker_is_stream_cut(servers):
    res = run(servers.http, "nodone", chat(3, tokens=3, delay_ms=5))
    assert res.error_category == "stream_cut"
    assert "end marker" in res.error_message
    assert len(res.chunk_ns) == 3


def test_malformed_chunk_is_bad_chunk(servers):
    res = run(servers.http, "malformed", chat(5, tokens=5, delay_ms=5))
    assert res.error_category == "bad_chunk"
    assert "not JSON" in res.error_message
    assert len(res.chunk_ns) == 2


def test_error_object_inside_stream(servers):
    res = run(servers.http, "inband-error", chat(5, tokens=5, delay_ms=5))
    assert res.error_category == "http_5xx"
    assert res.error_message == "error in stream: engine overloaded"


def test_unreachable_and_reset(servers):
    from tests.conftest import free_port

    res = run(f"http://127.0.0.1:{free_port()}", "ok", chat(2))
    assert res.error_category == "connection" and "connection refused" in res.error_message
    res = run(servers.raw, "raw-reset", chat(2))
    assert res.error_category == "connection"
    assert res.error_message == "server closed the connection before answering"


def test_error_categories_are_the_results_format_ones(servers):
    from analysis.records import CUT_AT_STOP, ERROR_CATEGORIES
    from loadgen.engine import client

    names = {client.HTTP_3XX, client.HTTP_4XX, client.HTTP_429, client.HTTP_5XX, client.TIMEOUT}
    names |= {client.CONNECTION, client.STREAM_CUT, client.BAD_CHUNK, client.EMPTY_REPLY, client.CLIENT_NETWORK}
    # cut_at_stop is the session's (a stop killed the request), never the client's own verdict.
    assert names | {CUT_AT_STOP} == set(ERROR_CATEGORIES)


# ---- non-streaming -----------------------------------------------------------------------------


def test_non_streaming_request(servers):
    req = chat(3, stream=False)
    res = run(servers.http, "json", req)
    assert res.ok, res.error_message
    assert res.text == " a b c"
    assert res.usage.completion_tokens == 3 and res.output_tokens == 3
    assert res.chunk_tokens == [3] and res.t_first_ns == res.chunk_ns[0]
    body = servers.log(req.request_id)["body"]
    assert body["stream"] is False and "stream_options" not in body


def test_request_carries_ids_and_auth(servers):
    from loadgen.engine.client import SessionConnection
    from targets.adapters.openai import OpenAIChatAdapter

    req = chat(2, tokens=2, delay_ms=1, session="agent-42")
    adapter = OpenAIChatAdapter()
    with SessionConnection(f"{servers.http}/ok", api_key="sk-test") as conn:
        res = conn.stream(adapter.build_request(req), adapter, deadline_s=5)
    assert res.ok
    log = servers.log(req.request_id)
    assert log["headers"]["X-Session-ID"] == "agent-42"
    assert log["headers"]["Authorization"] == "Bearer sk-test"
    assert log["body"]["user"] == "agent-42"
    assert log["body"]["stream_options"] == {"include_usage": True}


if __name__ == "__main__":
    if sys.argv[1:] == ["serve"]:
        _serve()


# ---- memory ------------------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", ["ok", "raw-chunked", "raw-close"])
def test_a_finished_reply_is_freed_without_the_cyclic_collector(servers, scenario):
    """A reply, its socket and its buffers go when the last reference does: a reference cycle
    per reply left every one to the cyclic collector, whose passes over a second's worth of
    replies stalled a worker's reads for 10-30 ms (two ticks' chunks then share one stamp)."""
    import gc

    base = servers.raw if scenario.startswith("raw") else servers.http
    assert run(base, scenario, chat(4, tokens=4, delay_ms=0)).ok  # first use: imports, caches
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for _ in range(3):
            req = chat(4, tokens=4, delay_ms=0)
            res = run(base, scenario, req)
            assert res.ok, res.error_message
        del res
        gc.collect()
        kinds = sorted({type(o).__qualname__ for o in gc.garbage if type(o).__module__.startswith(("loadgen", "gevent"))})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert kinds == [], f"reference cycles left by a reply: {kinds}"
