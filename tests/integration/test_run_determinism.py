"""Same seed, same traffic: two runs send byte-identical prompts.

A real OpenAI-compatible server on 127.0.0.1 records every request body and streams a reply
that differs from run to run, so the check also shows that follow-up turns differ only by the
assistant text the server returned.
"""

from __future__ import annotations

import asyncio
import secrets
import threading

import orjson
from aiohttp import web

from .runs import loadgen


class RecordingServer:
    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.reply_word = "alpha"
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        self._started.wait(10)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        self._started.set()
        self._loop.run_forever()

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "recorder", "object": "model"}]})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.bodies.append(body)
        max_tokens = orjson.loads(body).get("max_tokens") or 4
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(max_tokens):
            chunk = {"choices": [{"index": 0, "delta": {"content": f" {self.reply_word}"}}]}
            await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        usage = {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": max_tokens}}
        await resp.write(b"data: " + orjson.dumps(usage) + b"\n\ndata: [DONE]\n\n")
        return resp

    def close(self) -> None:
        async def stop() -> None:
            await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)


def _run_and_capture(tmp_path, server: RecordingServer, name: str) -> list[dict]:
    server.bodies.clear()
    server.reply_word = secrets.token_hex(3).translate(str.maketrans("0123456789", "ghijklmnop"))
    r = loadgen(
        "run", "--target", server.url, "--workload", "tiny", "--num-sessions", "12", "--rate", "20",
        "--seed", "11", "--results", str(tmp_path / name),
        # What is sent is checked here, not when: with 31 requests the lag p99 is the single worst
        # one, and one timer hiccup on a busy machine must not fail a check about prompts.
        "--max-schedule-lag", "1s",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    return [orjson.loads(b) for b in server.bodies if b"Say hello." not in b]  # drop the preflight


def _key(body: dict) -> tuple[str, int]:
    return body["user"], sum(1 for m in body["messages"] if m["role"] == "user")


def test_same_seed_sends_the_same_prompts(tmp_path) -> None:
    server = RecordingServer()
    try:
        a = _run_and_capture(tmp_path, server, "a")
        b = _run_and_capture(tmp_path, server, "b")
    finally:
        server.close()
    assert len(a) == len(b) >= 24
    by_a = {_key(x): x for x in a}
    by_b = {_key(x): x for x in b}
    assert by_a.keys() == by_b.keys()
    follow_ups = 0
    for key, x in by_a.items():
        y = by_b[key]
        if key[1] == 1:  # first turns: byte-identical bodies
            assert orjson.dumps(x, option=orjson.OPT_SORT_KEYS) == orjson.dumps(y, option=orjson.OPT_SORT_KEYS)
            continue
        follow_ups += 1
        # Follow-ups carry the replies the server streamed, which differed between the runs...
        assert [m["content"] for m in x["messages"] if m["role"] == "assistant"] != [
            m["content"] for m in y["messages"] if m["role"] == "assistant"
        ]
        # ...and that is the only difference.
        for body in (x, y):
            for m in body["messages"]:
                if m["role"] == "assistant":
                    m["content"] = "<reply>"
        assert orjson.dumps(x, option=orjson.OPT_SORT_KEYS) == orjson.dumps(y, option=orjson.OPT_SORT_KEYS)
    assert follow_ups >= 12
