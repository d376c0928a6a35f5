"""The capture proxy as a real process between a real client and a real upstream, all on 127.0.0.1.

The upstream is an aiohttp server in a thread of this process that writes known bytes in known
pieces, so the client's copy can be compared byte for byte, and that notes when its connection to
the proxy goes away (the proxy must close it when its own client leaves mid-stream).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from aiohttp import web
from click.testing import CliRunner

from loadgen.capture.process import CaptureProcess
from loadgen.capture.pump import RELAY
from loadgen.cli import main
from workloads import load_workload

ROLE = b'data: {"id":"c1","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
# One SSE line split across two writes, a keep-alive comment, usage, [DONE]: forwarded as they come.
TAIL = [
    b'data: {"id":"c1","choices":[{"index":0,"del',
    b'ta":{"content":" hi"}}]}\n\ndata: {"id":"c1","choices":[{"index":0,"delta":{"content":" there"}}]}\n\n',
    b": keep-alive\n\n",
    b'data: {"id":"c1","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}\n\n',
    b"data: [DONE]\n\n",
]
ERROR_BODY = b'{"error":{"message":"slow down","type":"rate_limit","code":429}}'


class Upstream:
    """A scripted upstream on a loopback port, served from its own thread and event loop."""

    def __init__(self) -> None:
        self.release = threading.Event()  # the test lets the scripted stream finish
        self.slow_gone_at: float | None = None
        self.seen_headers: dict[str, str] = {}
        self.loop = asyncio.new_event_loop()
        self.port = 0  # the port it got, once serving
        ready = threading.Event()
        self.thread = threading.Thread(target=self._serve, args=(ready,), daemon=True)
        self.thread.start()
        assert ready.wait(10), "the upstream did not start"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._refuse)
        app.router.add_get("/v1/models", self._models)
        self.runner = web.AppRunner(app, access_log=None)
        self.loop.run_until_complete(self.runner.setup())
        self.loop.run_until_complete(web.TCPSite(self.runner, "127.0.0.1", 0).start())
        self.port = self.runner.addresses[0][1]
        ready.set()
        self.loop.run_forever()

    def close(self) -> None:
        self.release.set()
        fut = asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop)
        fut.result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "X-Upstream": "scripted"})
        await resp.prepare(request)
        await resp.write(ROLE)
        if body.get("cut"):  # the upstream breaks off mid-reply
            await asyncio.sleep(0.05)
            request.transport.close()
            return resp
        if body.get("slow"):
            try:
                for _ in range(500):  # 10 s at most
                    await resp.write(b'data: {"choices":[{"index":0,"delta":{"content":" x"}}]}\n\n')
                    await asyncio.sleep(0.02)
            except ConnectionError:
                self.slow_gone_at = time.monotonic()
            return resp
        await asyncio.get_running_loop().run_in_executor(None, self.release.wait, 10)
        for piece in TAIL:
            await resp.write(piece)
            await asyncio.sleep(0.005)
        if body.get("linger"):  # the body's end comes well after [DONE]
            await asyncio.sleep(0.5)
        await resp.write_eof()
        return resp

    async def _refuse(self, request: web.Request) -> web.Response:
        await request.read()
        return web.Response(
            status=429, body=ERROR_BODY, headers={"Retry-After": "7"}, content_type="application/json"
        )

    async def _models(self, request: web.Request) -> web.Response:
        self.seen_headers = dict(request.headers)
        return web.json_response({"path_qs": request.path_qs})


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    up = Upstream()
    try:
        yield up
    finally:
        up.close()


def _chat_body(**extra: object) -> bytes:
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "say hi"}]
    return json.dumps({"messages": msgs, "max_tokens": 50, "stream": True, **extra}).encode()


@pytest.mark.parametrize("relay", ["compiled", "python"])
def test_proxy_forwards_bytes_as_they_come_passes_errors_and_survives_a_client_leaving(
    tmp_path, upstream, relay, monkeypatch
) -> None:
    if relay == "compiled" and RELAY != "compiled":
        pytest.skip("the relay pump is not built (make setup builds it)")
    monkeypatch.setenv("LOADGEN_RELAY", relay)  # the capture child's relay (pump.py)
    out = tmp_path / "cap.jsonl"
    cap = CaptureProcess.start(["--upstream", upstream.url, "--out", str(out)])
    assert cap.listening.rstrip().endswith(f"relay: {relay})"), cap.listening
    try:
        # 1. A stream: the first chunk reaches the client while the upstream still holds the rest.
        conn = http.client.HTTPConnection("127.0.0.1", cap.port, timeout=10)
        conn.request("POST", "/v1/chat/completions", body=_chat_body(),
                     headers={"Content-Type": "application/json", "X-Session-ID": "t1"})  # fmt: skip
        resp = conn.getresponse()
        assert resp.status == 200 and resp.getheader("X-Upstream") == "scripted"
        first = resp.read1(65536)
        assert first == ROLE, first
        upstream.release.set()
        assert first + resp.read() == ROLE + b"".join(TAIL)

        # Crash safety: the open session is on disk within the write interval (1 s), as a valid file,
        # so a capture killed now would keep it.
        deadline = time.monotonic() + 5
        while b'"t1"' not in out.read_bytes() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [s.session_id for s in load_workload(str(out)).sessions(0, 1)] == ["t1"]

        # 2. Other paths, the query string and the client's headers go through unchanged.
        conn.request("GET", "/v1/models?a=1&b=%2F", headers={"Authorization": "Bearer k", "X-Custom": "v"})
        models = conn.getresponse()
        assert json.loads(models.read()) == {"path_qs": "/v1/models?a=1&b=%2F"}
        assert (
            upstream.seen_headers["Authorization"] == "Bearer k" and upstream.seen_headers["X-Custom"] == "v"
        )

        # 3. An upstream error comes back as it was sent: status, header, body.
        conn.request(
            "POST", "/v1/completions", body=b'{"prompt": "x"}', headers={"Content-Type": "application/json"}
        )
        refused = conn.getresponse()
        assert (refused.status, refused.getheader("Retry-After"), refused.read()) == (429, "7", ERROR_BODY)
        conn.close()

        # 4. An upstream that breaks off mid-reply: the client's reply is cut too, not ended cleanly.
        conn = http.client.HTTPConnection("127.0.0.1", cap.port, timeout=10)
        conn.request(
            "POST", "/v1/chat/completions", body=_chat_body(cut=True), headers={"X-Session-ID": "t4"}
        )
        broken = conn.getresponse()
        with pytest.raises(http.client.IncompleteRead) as got:
            broken.read()
        assert got.value.partial == ROLE
        conn.close()

        # 5. A client that hangs up right after [DONE], before the body's end: its turn is whole.
        with _raw_post(cap.port, _chat_body(linger=True), session="t3") as s:
            got = b""
            while b"[DONE]" not in got:
                got += s.recv(65536)

        # 6. A client that leaves mid-stream: the proxy closes its upstream request and lives on.
        with _raw_post(cap.port, _chat_body(slow=True), session="t2") as s:
            assert b"200 OK" in s.recv(65536)
        deadline = time.monotonic() + 5
        while upstream.slow_gone_at is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert upstream.slow_gone_at is not None, "the upstream request was not closed after the client left"
        health = http.client.HTTPConnection("127.0.0.1", cap.port, timeout=10)
        health.request("GET", "/v1/models")
        assert health.getresponse().status == 200
        health.close()
    finally:
        rc = cap.stop()
    assert rc == 0, cap.stderr()
    assert "1 cut by the client, 2 failed upstream" in cap.output, cap.output
    # Every recorded exchange reached the assembler process once: five requests, each settled once.
    assert (
        "(5 requests; not recorded: 1 cut by the client, 2 failed upstream, 0 unreadable)"
        in cap.output
    ), cap.output
    wl = load_workload(str(out))
    sessions = {s.session_id: s for s in wl.sessions(0, wl.num_sessions)}
    assert sorted(sessions) == ["t1", "t3"]
    for s in sessions.values():
        assert s.system_prompt == "be brief"
        assert [(t.content, t.max_tokens) for t in s.turns] == [("say hi", 2)]


def _raw_post(port: int, body: bytes, *, session: str) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Session-ID: "
        + session.encode() + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )  # fmt: skip
    return s


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--listen", "localhost:http"], "--listen 'localhost:http' is not HOST:PORT"),
        (["--listen", "127.0.0.1:70000"], "is not HOST:PORT"),
        (["--upstream", "127.0.0.1:8000"], "is not an http(s) URL"),
        (["--upstream", "ftp://127.0.0.1:21"], "is not an http(s) URL"),
        (["--out", "/no/such/dir/cap.jsonl"], "does not exist"),
        (["--out", "{tmp}"], "is a directory"),
        (["--out", "{tmp}/full.jsonl"], "already holds data"),
        (["--listen", "127.0.0.1:{busy}"], "cannot listen"),
        (["--idle-timeout", "0s"], "would end every session after one turn"),
    ],
)
def test_bad_flags_are_one_line_errors_with_exit_code_2(tmp_path, flags, says) -> None:
    (tmp_path / "full.jsonl").write_text('{"id": "a"}\n')
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        given = {
            "--listen": "127.0.0.1:0",
            "--upstream": "http://127.0.0.1:9",
            "--out": str(tmp_path / "new.jsonl"),
        }
        for name, value in zip(flags[::2], flags[1::2], strict=True):
            given[name] = value.format(tmp=tmp_path, busy=port)
        args = ["capture", *[x for kv in given.items() for x in kv]]
        result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and says in lines[0], result.output
    assert not (tmp_path / "new.jsonl").exists()
