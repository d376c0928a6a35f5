"""The sim as a real server: started as a subprocess on 127.0.0.1 port 0 (its listening line parsed),
driven by a real HTTP client (aiohttp), checked against its own ground truth.

The helpers at the top (``stream``, ``get_json``, ``sims``) are shared by the other
``test_sim_*.py`` integration modules.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import aiohttp
import orjson
import pytest

from targets.sim.process import SimProcess
from workloads.tokenizer import render_chat, token_ids


@dataclass
class StreamResult:
    status: int
    headers: dict
    t_send_ns: int
    chunks: list[tuple[int, dict]] = field(default_factory=list)  # (arrival ns, parsed chunk)
    bad_lines: list[bytes] = field(default_factory=list)  # data lines that were not JSON
    done: bool = False  # saw data: [DONE]
    error: str | None = None  # a transport error (cut stream)
    body: bytes = b""  # non-SSE body

    @property
    def content_chunks(self) -> list[tuple[int, dict]]:
        out = []
        for t, c in self.chunks:
            ch = c.get("choices") or []
            if ch and (ch[0].get("delta", {}).get("content") or ch[0].get("text")):
                out.append((t, c))
        return out

    @property
    def text(self) -> str:
        parts = []
        for _, c in self.content_chunks:
            ch = c["choices"][0]
            parts.append(ch.get("delta", {}).get("content") or ch.get("text") or "")
        return "".join(parts)

    @property
    def usage(self) -> dict | None:
        for _, c in self.chunks:
            if c.get("usage"):
                return c["usage"]
        return None

    @property
    def t_first_ns(self) -> int:
        return self.content_chunks[0][0]


async def stream(url: str, path: str, body: dict, headers: dict | None = None, timeout_s: float = 30) -> StreamResult:
    """POST and read the SSE stream line by line, timestamping each data line as it arrives."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        t_send = time.perf_counter_ns()
        async with session.post(url + path, data=orjson.dumps(body), headers=headers or {}) as resp:
            res = StreamResult(resp.status, dict(resp.headers), t_send)
            if resp.content_type != "text/event-stream":
                res.body = await resp.read()
                return res
            try:
                async for line in resp.content:
                    t = time.perf_counter_ns()
                    line = line.strip()
                    if not line.startswith(b"data: "):
                        continue
                    payload = line[6:]
                    if payload == b"[DONE]":
                        res.done = True
                        continue
                    try:
                        res.chunks.append((t, orjson.loads(payload)))
                    except orjson.JSONDecodeError:
                        res.bad_lines.append(payload)
            except aiohttp.ClientPayloadError as e:
                res.error = f"payload: {e}"
            except aiohttp.ClientConnectionError as e:
                res.error = f"connection: {e}"
            return res


async def get_json(url: str, path: str) -> tuple[int, object]:
    async with aiohttp.ClientSession() as session, session.get(url + path) as resp:
        body = await resp.read()
        try:
            return resp.status, orjson.loads(body)
        except orjson.JSONDecodeError:
            return resp.status, body.decode()


def run(coro):
    return asyncio.run(coro)


class SimFactory:
    """Starts sims for one test and stops every one of them afterwards."""

    def __init__(self) -> None:
        self.started: list[SimProcess] = []

    def __call__(self, *args: str) -> SimProcess:
        sim = SimProcess.start(list(args))
        self.started.append(sim)
        return sim

    def finish(self) -> None:
        """Stop every sim and fail if one of them printed a traceback."""
        for err in self.stop_all():
            assert "Traceback" not in err, err

    def stop_all(self) -> list[str]:
        """Stop every sim; returns their stderr texts."""
        errs = []
        while self.started:
            sim = self.started.pop()
            sim.stop()
            errs.append(sim.stderr())
        return errs


@pytest.fixture
def sims():
    """``sims(*flags)`` starts a sim; all are stopped (SIGTERM, then SIGKILL) when the test ends."""
    factory = SimFactory()
    try:
        yield factory
    finally:
        factory.finish()


def chat_body(messages, max_tokens, stream=True, usage=True, **extra):
    body = {"model": "x", "messages": messages, "max_tokens": max_tokens, "stream": stream, **extra}
    if usage:
        body["stream_options"] = {"include_usage": True}
    return body


USER = [{"role": "system", "content": "you are a test"}, {"role": "user", "content": "read the file and report"}]
MS = 1_000_000  # ns


# --- streaming ---------------------------------------------------------------------------------
def test_stream_has_exact_usage_and_one_chunk_per_token(sims):
    sim = sims("--profile", "tiny", "--time-scale", "1")
    res = run(stream(sim.url, "/v1/chat/completions", chat_body(USER, 23), {"X-Request-ID": "req-1"}))
    assert res.status == 200 and res.done and res.error is None
    assert res.headers["X-Request-ID"] == "req-1"
    assert res.headers["Content-Type"].startswith("text/event-stream")
    first = res.chunks[0][1]["choices"][0]
    assert first["delta"] == {"role": "assistant", "content": ""}  # role-only chunk first
    assert len(res.content_chunks) == 23
    assert all(c["choices"][0]["delta"]["content"].startswith(" ") for _, c in res.content_chunks)
    reasons = [c["choices"][0]["finish_reason"] for _, c in res.chunks if c.get("choices")]
    assert reasons[-1] == "length" and set(reasons[:-1]) == {None}
    prompt_tokens = len(token_ids(render_chat(USER)))
    assert res.usage == {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": 23,
        "total_tokens": prompt_tokens + 23,
        "prompt_tokens_details": {"cached_tokens": 0},
    }

    status, truth = run(get_json(sim.url, "/sim/requests/req-1"))
    assert status == 200
    assert truth["outcome"] == "ok" and truth["status"] == 200 and truth["fault"] is None
    assert truth["completion_tokens"] == 23 and len(truth["t_chunks_ns"]) == 23
    assert truth["prompt_tokens"] == prompt_tokens
    assert truth["t_first_token_ns"] == truth["t_chunks_ns"][0]
    assert truth["t_received_ns"] < truth["t_first_token_ns"] <= truth["t_chunks_ns"][-1] <= truth["t_end_ns"]
    # the client reads each chunk after the sim wrote it, and soon after (same host, same clock)
    client = [t for t, _ in res.content_chunks]
    for c, s in zip(client, truth["t_chunks_ns"], strict=True):
        assert 0 <= c - s < 200 * MS
    assert truth["t_received_ns"] >= res.t_send_ns


def test_chunks_are_written_at_the_engine_step_times(sims):
    """At time-scale 1 the gaps between token writes follow the tiny profile's step time."""
    sim = sims("--profile", "tiny", "--time-scale", "1")
    run(stream(sim.url, "/v1/chat/completions", chat_body(USER, 40), {"X-Request-ID": "steps"}))
    truth = run(get_json(sim.url, "/sim/requests/steps"))[1]
    gaps = [b - a for a, b in zip(truth["t_chunks_ns"], truth["t_chunks_ns"][1:], strict=False)]
    model_s = truth["decode_s"] / 39  # virtual seconds per decode step (about 1.5 ms)
    wall = (truth["t_chunks_ns"][-1] - truth["t_chunks_ns"][0]) / 1e9
    assert wall == pytest.approx(truth["decode_s"], abs=0.05)  # the sleeps track the virtual clock
    assert sorted(gaps)[len(gaps) // 2] / 1e9 == pytest.approx(model_s, abs=0.003)


def test_non_streaming_and_completions(sims):
    sim = sims("--profile", "tiny", "--time-scale", "0")
    res = run(stream(sim.url, "/v1/chat/completions", chat_body(USER, 9, stream=False), {"X-Request-ID": "ns"}))
    body = orjson.loads(res.body)
    assert res.status == 200 and body["object"] == "chat.completion"
    assert len(token_ids(body["choices"][0]["message"]["content"])) == 9
    assert body["usage"]["completion_tokens"] == 9
    assert res.headers["X-Request-ID"] == "ns"

    comp = run(stream(sim.url, "/v1/completions", {"prompt": "hello world", "max_tokens": 5, "stream": True}))
    assert comp.done and len(comp.content_chunks) == 5
    assert comp.chunks[0][1]["object"] == "text_completion"
    plain = run(stream(sim.url, "/v1/completions", {"prompt": "hello world", "max_tokens": 5}))
    assert orjson.loads(plain.body)["choices"][0]["text"] == comp.text  # same prompt, same reply


def test_default_max_tokens_and_max_completion_tokens(sims):
    sim = sims("--profile", "tiny", "--time-scale", "0")
    res = run(stream(sim.url, "/v1/chat/completions", {"messages": USER, "stream": True}))
    assert len(res.content_chunks) == 16  # tiny's default_max_tokens
    res = run(stream(sim.url, "/v1/chat/completions", {"messages": USER, "stream": True, "max_completion_tokens": 3}))
    assert len(res.content_chunks) == 3


def test_same_seed_same_conversation_across_processes(sims):
    a = sims("--profile", "tiny", "--time-scale", "0", "--seed", "7")
    b = sims("--profile", "tiny", "--time-scale", "0", "--seed", "7")
    c = sims("--profile", "tiny", "--time-scale", "0", "--seed", "8")
    texts = [run(stream(s.url, "/v1/chat/completions", chat_body(USER, 30))).text for s in (a, b, c)]
    assert texts[0] == texts[1] != texts[2]
    assert len(token_ids(texts[0])) == 30


# --- prefix cache ------------------------------------------------------------------------------
def test_follow_up_turn_hits_the_prefix_cache(sims):
    sim = sims("--profile", "tiny", "--time-scale", "0")
    history = [{"role": "system", "content": " ".join(["cache"] * 300)}, {"role": "user", "content": "go"}]
    first = run(stream(sim.url, "/v1/chat/completions", chat_body(history, 20)))
    assert first.usage["prompt_tokens_details"]["cached_tokens"] == 0
    history += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "and then"}]
    second = run(stream(sim.url, "/v1/chat/completions", chat_body(history, 5)))
    cached = second.usage["prompt_tokens_details"]["cached_tokens"]
    # prompt of turn 1 (305 tokens with chat markers) + 19 of its 20 reply tokens, in whole blocks
    assert cached == (len(token_ids(render_chat(history[:2]))) + 19) // 16 * 16
    assert cached < second.usage["prompt_tokens"]


def test_cache_hit_ttft_is_over_10x_lower_on_the_laptop_profile(sims):
    sim = sims("--profile", "laptop-qwen2.5-1.5b-q4", "--time-scale", "1")
    words = " ".join(["token"] * 1990)
    msgs = [{"role": "user", "content": words}]
    cold = run(stream(sim.url, "/v1/chat/completions", chat_body(msgs, 2), {"X-Request-ID": "cold"}))
    warm = run(stream(sim.url, "/v1/chat/completions", chat_body(msgs, 2), {"X-Request-ID": "warm"}))
    assert warm.usage["prompt_tokens_details"]["cached_tokens"] >= 1980
    truth = {k: run(get_json(sim.url, f"/sim/requests/{k}"))[1] for k in ("cold", "warm")}
    sim_ttft = {k: (v["t_first_token_ns"] - v["t_received_ns"]) / 1e9 for k, v in truth.items()}
    client_ttft = {"cold": (cold.t_first_ns - cold.t_send_ns) / 1e9, "warm": (warm.t_first_ns - warm.t_send_ns) / 1e9}
    # the model: ~0.33 s cold (2,000 tokens of compute-bound prefill), ~9 ms warm
    assert 0.25 < sim_ttft["cold"] < 0.45
    assert sim_ttft["cold"] / sim_ttft["warm"] >= 10
    assert client_ttft["cold"] / client_ttft["warm"] >= 10
    # what the client measured is the sim's truth plus transport (small on loopback)
    for k in ("cold", "warm"):
        assert client_ttft[k] >= sim_ttft[k]
        assert client_ttft[k] - sim_ttft[k] < 0.05
    # and the truth follows the model: wall TTFT ~ virtual queue + prefill at time-scale 1
    for k, v in truth.items():
        assert sim_ttft[k] == pytest.approx(v["queue_s"] + v["prefill_s"], abs=0.02)


# --- admission ---------------------------------------------------------------------------------
def test_full_queue_answers_429_with_retry_after(sims):
    sim = sims("--profile", "tiny", "--time-scale", "1")  # 8 slots, 32 waiting

    async def burst():
        bodies = [chat_body([{"role": "user", "content": f"q {i}"}], 100) for i in range(60)]
        return await asyncio.gather(*(stream(sim.url, "/v1/chat/completions", b) for b in bodies))

    results = run(burst())
    rejected = [r for r in results if r.status == 429]
    served = [r for r in results if r.status == 200]
    # a burst can fill the queue before the first step admits anyone: at least max_waiting served
    assert len(rejected) + len(served) == 60
    assert len(rejected) >= 10 and len(served) >= 32
    assert all(r.headers.get("Retry-After") == "1" for r in rejected)
    assert all(orjson.loads(r.body)["error"]["code"] == 429 for r in rejected)
    assert all(len(r.content_chunks) == 100 and r.done for r in served)
    metrics = parse_metrics(run(get_json(sim.url, "/metrics"))[1])
    assert metrics["sim:requests_rejected_total"] == len(rejected)
    assert metrics["sim:requests_total"] == 60
    assert metrics["sim:request_success_total"] == len(served)


def test_bad_body_gets_an_openai_error(sims):
    sim = sims("--profile", "tiny", "--time-scale", "0")
    for body in ({"messages": "nope"}, {"messages": USER, "max_tokens": -1}):
        res = run(stream(sim.url, "/v1/chat/completions", body))
        err = orjson.loads(res.body)["error"]
        assert res.status == 400 and err["code"] == 400 and err["message"] and "type" in err
        assert res.headers.get("X-Request-ID")

    async def raw():
        async with aiohttp.ClientSession() as s, s.post(sim.url + "/v1/completions", data=b"{not json") as r:
            return r.status, await r.json()

    status, body = run(raw())
    assert status == 400 and "JSON" in body["error"]["message"]
    res = run(stream(sim.url, "/v1/chat/completions", chat_body(USER, 5000)))
    assert res.status == 400  # longer than the model's context


# --- information endpoints ---------------------------------------------------------------------
def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text format: every sample line is ``name{labels} value``."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, value = line.rsplit(" ", 1)
        name = name_labels.split("{", 1)[0]
        if name.startswith("vllm:"):  # vLLM's names beside the sim's: test_sim_vllm_metrics.py
            continue
        assert name.startswith("sim:")
        out[name] = float(value)
    return out


def test_metrics_parse_and_count(sims):
    sim = sims("--profile", "tiny", "--time-scale", "0")
    history = [{"role": "user", "content": " ".join(["same"] * 100)}]
    for _ in range(3):
        run(stream(sim.url, "/v1/chat/completions", chat_body(history, 4)))
    status, text = run(get_json(sim.url, "/metrics"))
    assert status == 200
    m = parse_metrics(text)
    for name in (
        "sim:num_requests_running",
        "sim:num_requests_waiting",
        "sim:prefix_cache_queries_total",
        "sim:prefix_cache_hits_total",
        "sim:prompt_tokens_total",
        "sim:generation_tokens_total",
        "sim:kv_cache_usage_perc",
        "sim:request_success_total",
        "sim:requests_total",
        "sim:requests_rejected_total",
    ):
        assert name in m
    prompt = len(token_ids(render_chat(history)))
    assert m["sim:requests_total"] == 3 and m["sim:request_success_total"] == 3
    assert m["sim:prompt_tokens_total"] == m["sim:prefix_cache_queries_total"] == 3 * prompt
    assert m["sim:prefix_cache_hits_total"] == 2 * (prompt // 16 * 16)
    assert m["sim:generation_tokens_total"] == 12
    assert m["sim:num_requests_running"] == 0 and m["sim:kv_cache_usage_perc"] == 0


def test_info_endpoints(sims):
    sim = sims("--profile", "tiny", "--time-scale", "0.5", "--seed", "3", "--model-name", "my-model",
               "--server-id", "replica-a")
    status, models = run(get_json(sim.url, "/v1/models"))
    assert status == 200 and [m["id"] for m in models["data"]] == ["my-model"]
    status, info = run(get_json(sim.url, "/sim/info"))
    assert info["profile"] == "tiny" and info["seed"] == 3 and info["time_scale"] == 0.5
    assert info["server_id"] == "replica-a" and info["pid"] == sim.pid and info["port"] == sim.port
    for path in ("/health", "/health_generate"):
        assert run(get_json(sim.url, path))[0] == 200
    assert run(get_json(sim.url, "/get_model_info"))[1]["model_path"] == "my-model"
    server_info = run(get_json(sim.url, "/get_server_info"))[1]
    assert server_info["dp_size"] == 1 and server_info["max_running_requests"] == 8
    assert "version" in run(get_json(sim.url, "/version"))[1]
    assert run(get_json(sim.url, "/sim/requests/never-sent"))[0] == 404
    default = sims("--profile", "tiny")
    assert run(get_json(default.url, "/v1/models"))[1]["data"][0]["id"] == "sim-tiny"


def test_truth_log_has_one_line_per_request(sims, tmp_path):
    log = tmp_path / "truth.jsonl"
    sim = sims("--profile", "tiny", "--time-scale", "0", "--truth-log", str(log))
    for i in range(3):
        run(stream(sim.url, "/v1/chat/completions", chat_body(USER, 3 + i), {"X-Request-ID": f"t{i}"}))
    run(stream(sim.url, "/v1/chat/completions", {"messages": 1}, {"X-Request-ID": "bad"}))
    lines = [orjson.loads(x) for x in log.read_bytes().splitlines()]
    assert [x["request_id"] for x in lines] == ["t0", "t1", "t2", "bad"]
    assert [x["completion_tokens"] for x in lines] == [3, 4, 5, 0]
    assert lines[3]["outcome"] == "bad_request" and lines[3]["status"] == 400
    assert lines[0] == run(get_json(sim.url, "/sim/requests/t0"))[1]


def test_sigterm_and_sigint_exit_cleanly(sims):
    import signal

    for sig in (signal.SIGTERM, signal.SIGINT):
        sim = sims("--profile", "tiny")
        sim.proc.send_signal(sig)
        assert sim.proc.wait(10) == 0
        assert "Traceback" not in sim.stderr()


def test_a_request_that_is_not_http_1_1_is_refused_in_one_log_line(sims):
    """Routers probe with HTTP/2 prior knowledge before falling back to HTTP/1.1."""
    import socket

    sim = sims("--profile", "tiny")
    with socket.create_connection(("127.0.0.1", sim.port), timeout=5) as s:
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        s.recv(1024)
    assert run(get_json(sim.url, "/health"))[0] == 200
    sim.stop()
    lines = [x for x in sim.stderr().splitlines() if x.strip()]
    assert len(lines) == 1 and "not valid HTTP/1.1" in lines[0]
