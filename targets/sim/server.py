"""The HTTP face of the simulated engine (aiohttp), driven in real time.

One asyncio task (``_drive``) runs the engine: it computes a step, sleeps until the step's end
mapped to wall time (``wall = t0 + virtual x time_scale``; ``time_scale`` 0 never sleeps), then
hands each emitted token to its request's handler, which writes the chunk at once. A handler
sleeps on one future per wake-up, so a chunk costs one wake-up, one byte concatenation and one
write. The times of those writes are the ground truth (``truth.py``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from targets.sim import faults as F
from targets.sim import info
from targets.sim.answers import reply_pieces
from targets.sim.api import BadRequest, chat_view, parse_request
from targets.sim.engine import ABORTED, FINISHED, Engine, QueueFull, RequestTooLong, SimSequence
from targets.sim.eos import LENGTH, STOP, reply_end
from targets.sim.kept_responses import KeptResponses, without_instructions
from targets.sim.metrics import ServerCounters, metric_values, render
from targets.sim.power import GpuPower, gpu_power, render_dcgm
from targets.sim.profile import Profile
from targets.sim.tool_calls import arguments, tool_called
from targets.sim.truth import (
    OUTCOME_BAD_REQUEST,
    OUTCOME_CLIENT_GONE,
    OUTCOME_FAULT,
    OUTCOME_OK,
    OUTCOME_REJECTED,
    OUTCOME_SHUTDOWN,
    TruthRecord,
    TruthStore,
)
from targets.sim.wire import (
    CHAT,
    COMPLETIONS,
    DONE,
    REASONING_WORD,
    WORDS_SPACED,
    StreamTemplate,
    call_id_of,
    error_body,
    full_response,
)
from targets.sim.wire_events import MESSAGES, RESPONSES, MessagesTemplate, ResponsesTemplate
from targets.sim.wire_events import error_body as event_api_error_body

REQUEST_ID_HEADER = "X-Request-ID"
RETRY_AFTER_S = 1
_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Everything a sim server needs; the CLI builds one from its flags."""

    profile: Profile
    time_scale: float = 1.0
    seed: int = 0
    model_name: str | None = None  # default: the profile's
    server_id: str | None = None  # default: "sim-<port>"
    faults: F.FaultConfig = field(default_factory=F.FaultConfig)
    truth_log: str | None = None
    truth_keep: int = 100_000
    answers: Mapping[str, str] | None = None  # question -> answer (targets.sim.answers)
    wrong_answers: bool = False  # answer every known question wrongly

    def __post_init__(self) -> None:
        if not (self.time_scale >= 0 and math.isfinite(self.time_scale)):
            raise ValueError(f"time_scale must be a finite number >= 0 (got {self.time_scale})")


class _OneLineBadRequests(logging.Filter):
    """aiohttp logs a traceback for every request it can't parse, e.g. a router's HTTP/2
    prior-knowledge probe (``PRI * HTTP/2.0``) before it falls back to HTTP/1.1: keep one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            first = (str(exc.message) or type(exc).__name__).strip().splitlines()[0]
            record.msg = "loadgen-sim: refused a request that is not valid HTTP/1.1 (%s)"
            record.args = (first,)
            record.exc_info = None
            record.exc_text = None
        return True


_BAD_REQUEST_FILTER = _OneLineBadRequests()


class _Stream:
    """Per-request rendezvous between the engine task and the request handler."""

    __slots__ = ("ready", "streaming", "waiter")

    def __init__(self, streaming: bool) -> None:
        self.streaming = streaming
        self.ready = 0  # tokens whose step has ended in wall time (the engine may be a step ahead)
        self.waiter: asyncio.Future | None = None


class SimServer:
    """A simulated engine behind OpenAI-compatible HTTP endpoints."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.profile = config.profile
        self.time_scale = config.time_scale
        self.model_name = config.model_name or config.profile.model_name
        self.server_id = config.server_id or ""
        self.engine = Engine(config.profile, seed=config.seed)
        self.truth = TruthStore(keep=config.truth_keep, log_path=config.truth_log)
        self.counters = ServerCounters()
        self.counters.size_buckets(config.profile.max_model_len)
        self.kept_responses = KeptResponses()  # for previous_response_id (/v1/responses)
        self.faults = F.FaultPicker(config.faults, config.seed)
        self.created = int(time.time())
        self.port: int | None = None
        self._t0 = time.perf_counter()
        self._work = asyncio.Event()
        self._driver: asyncio.Task | None = None
        self._runner: web.AppRunner | None = None

    # --- clock -------------------------------------------------------------------------------
    def virtual_now(self) -> float:
        """Virtual seconds now: wall time since start / time_scale (the engine's clock at scale 0)."""
        if self.time_scale > 0:
            return (time.perf_counter() - self._t0) / self.time_scale
        return self.engine.now

    # --- lifecycle ---------------------------------------------------------------------------
    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        r = app.router
        r.add_post("/v1/chat/completions", self._chat)
        r.add_post("/v1/completions", self._completions)
        r.add_post("/v1/messages", self._messages)
        r.add_post("/v1/responses", self._responses)
        r.add_get("/health", self._health)
        r.add_get("/health_generate", self._health)
        r.add_get("/metrics", self._metrics)
        r.add_get("/dcgm/metrics", self._dcgm_metrics)  # modelled GPU power (targets/sim/power.py)
        r.add_get("/v1/models", self._serve_json(info.models))
        r.add_get("/version", self._serve_json(info.version))
        for path in ("/get_model_info", "/model_info"):
            r.add_get(path, self._serve_json(info.model_info))
        for path in ("/get_server_info", "/server_info"):
            r.add_get(path, self._serve_json(info.server_info))
        r.add_get("/get_load", self._serve_json(info.load))
        r.add_get("/sim/info", self._serve_json(info.sim_info))
        r.add_get("/sim/requests/{request_id}", self._sim_request)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Bind and serve; returns the port (useful with ``port=0``)."""
        server_log = logging.getLogger("aiohttp.server")
        if _BAD_REQUEST_FILTER not in server_log.filters:
            server_log.addFilter(_BAD_REQUEST_FILTER)
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        self.port = sock.getsockname()[1]
        if not self.server_id:
            self.server_id = f"sim-{self.port}"
        self._runner = web.AppRunner(self.make_app(), access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.SockSite(self._runner, sock, backlog=4096).start()
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _on_startup(self, _app: web.Application) -> None:
        self._t0 = time.perf_counter()
        self._driver = asyncio.get_running_loop().create_task(self._drive())

    async def _on_cleanup(self, _app: web.Application) -> None:
        if self._driver is not None and not self._driver.done():
            self._driver.cancel()
            try:
                await self._driver
            except asyncio.CancelledError:
                pass
        self.truth.close()

    # --- the engine loop ---------------------------------------------------------------------
    async def _drive(self) -> None:
        engine = self.engine
        scale = self.time_scale
        perf = time.perf_counter
        sleep = asyncio.sleep
        while True:
            start = engine.next_step_start()
            if start is None:
                self._work.clear()
                await self._work.wait()
                continue
            if scale > 0:
                delay = self._t0 + start * scale - perf()
                if delay > 0:  # the head of the queue is still in its request overhead
                    await sleep(delay)
                    continue
            step = engine.step()
            if step is None:
                continue
            if scale > 0:
                delay = self._t0 + step.end_s * scale - perf()
                if delay > 0:
                    await sleep(delay)
            else:
                await sleep(0)  # let the handlers write
            for seq in step.emitted:
                stream = seq.handle
                stream.ready = seq.generated
                waiter = stream.waiter
                if waiter is not None and (stream.streaming or seq.generated >= seq.max_tokens):
                    stream.waiter = None
                    if not waiter.done():
                        waiter.set_result(None)

    # --- generation endpoints ----------------------------------------------------------------
    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._handle_generation(request, CHAT)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._handle_generation(request, COMPLETIONS)

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        return await self._handle_generation(request, MESSAGES)

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        return await self._handle_generation(request, RESPONSES)

    def _event_template(
        self, endpoint: str, reply_id: str, reasoning: int, tool: str | None = None, answer_tokens: int = 0
    ) -> MessagesTemplate | ResponsesTemplate:
        if endpoint == MESSAGES:
            return MessagesTemplate(reply_id, self.model_name, reasoning, tool, answer_tokens)
        return ResponsesTemplate(reply_id, self.created, self.model_name, reasoning, tool, answer_tokens)

    async def _handle_generation(self, request: web.Request, endpoint: str) -> web.StreamResponse:
        t_received = time.perf_counter_ns()
        self.counters.requests_received += 1
        rid = request.headers.get(REQUEST_ID_HEADER) or uuid.uuid4().hex
        rec = TruthRecord(rid, self.server_id, endpoint, False, t_received, self.time_scale)
        rec.client_port = _client_port(request)
        try:
            raw = await request.read()
            try:
                body = orjson.loads(raw)
            except orjson.JSONDecodeError as e:
                raise BadRequest(f"the request body is not valid JSON: {e}") from None
            history = self.kept_responses.history_of(body, time.monotonic()) if endpoint == RESPONSES else None
            req = parse_request(endpoint, body, self.profile.default_max_tokens, history)
            if endpoint in (CHAT, COMPLETIONS):
                pieces = reply_pieces(self.config.answers, self.config.wrong_answers, endpoint == CHAT, body)
            else:  # the question is the last user message, as for chat
                view = chat_view(endpoint, body, history)
                pieces = reply_pieces(self.config.answers, self.config.wrong_answers, True, view)
        except BadRequest as e:
            return self._refuse(rec, 400, str(e), "BadRequestError", OUTCOME_BAD_REQUEST)
        rec.stream = req.stream
        if self.profile.reasoning_tokens:
            rec.prompt_reasoning_words = raw.count(REASONING_WORD)
        rec.prompt_tokens = len(req.prompt_ids)
        rec.max_tokens = req.max_tokens

        fault = self.faults.draw()
        if fault is not None:
            self.counters.faults_injected += 1
            rec.fault = fault
        if fault == F.HTTP_500:
            return self._refuse(rec, 500, "injected fault: internal server error", "InternalServerError", OUTCOME_FAULT)
        if fault == F.HTTP_429:
            return self._refuse(
                rec, 429, "injected fault: too many requests", "RateLimitError", OUTCOME_FAULT, retry_after=True
            )

        stream = _Stream(req.stream)
        try:
            if pieces is None:  # filler words, to max_tokens or to an end drawn from eos_lengths
                end = reply_end(self.profile.eos_lengths, self.config.seed, req.prompt_ids, req.max_tokens, req.ignore_eos)
                n_tokens, rec.finish_reason, rec.eos_length = end.tokens, end.finish_reason, end.drawn
                if endpoint != COMPLETIONS:  # a reply after any reasoning may be a tool call instead
                    rec.tool_call = tool_called(self.profile.tool_calls, self.config.seed, req.prompt_ids, req.tool_names)
            else:  # a known question's reply is its answer: as many tokens as it has words, at most
                n_tokens = min(req.max_tokens, len(pieces))
                rec.finish_reason = STOP if n_tokens == len(pieces) else LENGTH
            seq = self.engine.add(rid, req.prompt_ids, n_tokens, self.virtual_now(), handle=stream)
        except QueueFull as e:
            self.counters.requests_rejected += 1
            return self._refuse(
                rec, 429, f"server busy: {e}", "RateLimitError", OUTCOME_REJECTED, retry_after=True
            )
        except RequestTooLong as e:
            return self._refuse(rec, 400, str(e), "BadRequestError", OUTCOME_BAD_REQUEST)
        self._work.set()
        rec.v_arrival_s = seq.arrival_s
        prefix = {CHAT: "chatcmpl-", COMPLETIONS: "cmpl-", MESSAGES: "msg_", RESPONSES: "resp_"}[endpoint]
        if endpoint == RESPONSES and body.get("store") is not False:  # stored, as the API does by default
            self._keep_response(prefix + rid, body, view["messages"], seq, pieces, rec.tool_call)
        try:
            if req.stream:
                return await self._stream(
                    request, rec, seq, stream, endpoint, prefix + rid, req.include_usage, pieces
                )
            return await self._respond(request, rec, seq, stream, endpoint, prefix + rid, pieces)
        finally:
            if seq.state not in (FINISHED, ABORTED):  # cancelled: the server is shutting down
                self.engine.abort(seq)
            if self.truth.get(rid) is not rec:
                rec.outcome = OUTCOME_SHUTDOWN
                rec.completion_tokens = len(rec.t_chunks_ns)
                rec.t_end_ns = time.perf_counter_ns()
                self._finish_record(rec, seq)

    async def _stream(
        self,
        request: web.Request,
        rec: TruthRecord,
        seq: SimSequence,
        stream: _Stream,
        endpoint: str,
        completion_id: str,
        include_usage: bool,
        pieces: list[str] | None = None,
    ) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers={**_SSE_HEADERS, REQUEST_ID_HEADER: rec.request_id})
        await resp.prepare(request)
        events = endpoint in (MESSAGES, RESPONSES)
        n = seq.max_tokens
        # Reasoning first (filler replies): tokens [0, r) are reasoning deltas, the answer is the
        # words from r on.
        r = _reasoning(self.profile, endpoint, n, pieces)
        rec.reasoning_tokens = r
        tool = rec.tool_call
        if events:
            tpl = self._event_template(endpoint, completion_id, r, tool, n - r)
        else:
            tpl = StreamTemplate(endpoint, completion_id, self.created, self.model_name, tool, n - r)
        words = seq.words
        token = tpl.tool_token if tool else tpl.token
        finish = rec.finish_reason or LENGTH
        if pieces is not None:  # a known question: its answer's words instead of filler words
            words, token = pieces, tpl.text_token
        reasoning_token = tpl.reasoning_token
        times = rec.t_chunks_ns
        fault = rec.fault if rec.fault in F.MID_STREAM else None
        fault_at = F.fault_token_index(n) if fault else -1
        loop = asyncio.get_running_loop()
        perf_ns = time.perf_counter_ns
        sent = 0
        rec.status = 200
        while sent < n:
            avail = stream.ready
            if avail == sent:
                if seq.state == ABORTED:
                    break
                waiter = loop.create_future()
                stream.waiter = waiter
                await waiter
                continue
            if fault and sent <= fault_at < avail:
                if sent < fault_at:
                    avail = fault_at  # write up to the fault point first
                else:
                    rec.fault_token_index = fault_at
                    if fault == F.CUT:
                        return self._cut(request, rec, seq, resp)
                    try:
                        if fault == F.STALL:
                            await asyncio.sleep(self.config.faults.stall_s)
                        else:
                            await resp.write(tpl.malformed())
                    except ConnectionError:
                        return self._client_gone(rec, seq, resp)
                    fault = None
                    continue
            if sent and (sent > r or not r):  # the common case: answer tokens only, no block opens
                parts = [token(words[i]) for i in range(sent, avail)]
            else:
                parts = []
                if sent == 0 and events:
                    parts.append(tpl.opening(rec.prompt_tokens, seq.cached_tokens))
                elif sent == 0 and endpoint == CHAT:
                    parts.append(tpl.role())
                for i in range(sent, avail):
                    if i < r:
                        parts.append(reasoning_token())
                        continue
                    if i == r and r and events:  # the reasoning block closes, the answer's opens
                        parts.append(tpl.answer_start())
                    parts.append(token(words[i]))
            last = avail == n
            if last and events:
                parts.append(tpl.closing(finish, rec.prompt_tokens, n, seq.cached_tokens))
            elif last:
                parts.append(tpl.finish(finish))
                if include_usage:
                    parts.append(tpl.usage(rec.prompt_tokens, n, seq.cached_tokens, r))
                parts.append(DONE)
            t = perf_ns()
            if sent == 0:
                rec.t_first_token_ns = t
            if sent <= r < avail:
                rec.t_first_output_ns = t
            times.extend([t] * (avail - sent))
            if last:  # the record is complete before the client can read [DONE] and ask for it
                rec.t_end_ns = t
                rec.completion_tokens = n
                self._finish_record(rec, seq)
                self._succeeded(rec, seq)
            try:
                await resp.write(b"".join(parts))
            except ConnectionError:
                if last:
                    return resp
                rec.completion_tokens = avail  # may not all have reached the client
                return self._client_gone(rec, seq, resp)
            if not last and (sent == 0 or sent <= r < avail):
                # The write happened between t and now: on a busy machine the sim can lose the CPU
                # in between, and a test bounds the client's times by both stamps.
                t_written = perf_ns()
                if sent == 0:
                    rec.t_first_token_written_ns = t_written
                if sent <= r < avail:
                    rec.t_first_output_written_ns = t_written
            sent = avail
        if sent < n:  # aborted while waiting (server shutting down)
            return resp
        try:
            await resp.write_eof()
        except ConnectionError:
            pass
        return resp

    async def _respond(
        self,
        request: web.Request,
        rec: TruthRecord,
        seq: SimSequence,
        stream: _Stream,
        endpoint: str,
        completion_id: str,
        pieces: list[str] | None = None,
    ) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        n = seq.max_tokens
        while stream.ready < n:
            if seq.state == ABORTED:
                return web.Response(status=503)
            waiter = loop.create_future()
            stream.waiter = waiter
            await waiter
        headers = {REQUEST_ID_HEADER: rec.request_id}
        if rec.fault == F.STALL:
            await asyncio.sleep(self.config.faults.stall_s)
        elif rec.fault == F.CUT:
            resp = web.StreamResponse(status=200, headers={**headers, "Content-Type": "application/json"})
            await resp.prepare(request)
            return self._cut(request, rec, seq, resp)
        if rec.fault == F.MALFORMED:
            body = b'{"id":"' + completion_id.encode() + b'","choices":[{"index":0,"message":'
        else:
            r = rec.reasoning_tokens = _reasoning(self.profile, endpoint, n, pieces)
            text = _answer_text(seq, r, pieces, rec.tool_call)
            finish = rec.finish_reason or LENGTH
            if endpoint in (MESSAGES, RESPONSES):
                body = self._event_template(endpoint, completion_id, r, rec.tool_call).full(
                    text, finish, rec.prompt_tokens, n, seq.cached_tokens
                )
            else:
                body = full_response(
                    endpoint, completion_id, self.created, self.model_name, text, rec.prompt_tokens, n,
                    seq.cached_tokens, r, finish, rec.tool_call,
                )  # fmt: skip
        rec.status = 200
        rec.completion_tokens = n
        rec.t_end_ns = time.perf_counter_ns()
        self._finish_record(rec, seq)
        if rec.fault is None:
            self._succeeded(rec, seq)
        return web.Response(body=body, status=200, content_type="application/json", headers=headers)

    def _keep_response(
        self,
        response_id: str,
        body: dict,
        messages: list,
        seq: SimSequence,
        pieces: list[str] | None,
        tool: str | None = None,
    ) -> None:
        """Keep the conversation through this reply's answer (the text its client gets, or the
        tool call it makes: reasoning is not part of it) for a later ``previous_response_id``."""
        r = _reasoning(self.profile, RESPONSES, seq.max_tokens, pieces)
        text = _answer_text(seq, r, pieces, tool)
        call = None
        if tool:
            call = {"id": call_id_of(response_id), "type": "function", "function": {"name": tool, "arguments": text}}
            text = ""
        conversation = without_instructions(body, messages)
        self.kept_responses.keep(response_id, conversation, text, time.monotonic(), call)

    # --- endings -----------------------------------------------------------------------------
    def _succeeded(self, rec: TruthRecord, seq: SimSequence) -> None:
        """Count a request that got every token, and time it for vLLM's latency histograms: wall
        times of the sim's writes (TTFT of a reply not streamed: the engine's, scaled to wall)."""
        c = self.counters
        c.requests_succeeded += 1
        if rec.t_first_token_ns is not None:
            ttft_s = (rec.t_first_token_ns - rec.t_received_ns) / 1e9
        else:
            ttft_s = ((seq.first_token_s or 0.0) - seq.arrival_s) * self.time_scale
        e2e_s = ((rec.t_end_ns or rec.t_received_ns) - rec.t_received_ns) / 1e9
        scale = self.time_scale
        engine_s = ((rec.queue_s or 0.0) * scale, (rec.prefill_s or 0.0) * scale, (rec.decode_s or 0.0) * scale)
        tokens = (rec.prompt_tokens, rec.completion_tokens)
        c.observe_finished(rec.finish_reason or LENGTH, ttft_s, e2e_s, engine_s, tokens, rec.t_chunks_ns)

    def _finish_record(self, rec: TruthRecord, seq: SimSequence | None) -> None:
        if rec.fault is not None and rec.outcome == OUTCOME_OK:
            rec.outcome = OUTCOME_FAULT
        if seq is not None:
            rec.cached_tokens = seq.cached_tokens
            rec.preemptions = seq.preemptions
            rec.queue_s = seq.queue_s
            rec.prefill_s = seq.prefill_s
            rec.v_first_token_s = seq.first_token_s
            if seq.token_times_s:
                rec.v_end_s = seq.token_times_s[-1]
                if seq.first_token_s is not None:
                    rec.decode_s = rec.v_end_s - seq.first_token_s
        if rec.outcome != OUTCOME_OK and rec.outcome != OUTCOME_REJECTED:
            self.counters.requests_failed += 1
        self.truth.add(rec)

    def _refuse(
        self,
        rec: TruthRecord,
        status: int,
        message: str,
        err_type: str,
        outcome: str,
        retry_after: bool = False,
    ) -> web.Response:
        rec.status = status
        rec.outcome = outcome
        rec.error = message
        rec.t_end_ns = time.perf_counter_ns()
        self._finish_record(rec, None)
        headers = {REQUEST_ID_HEADER: rec.request_id}
        if retry_after:
            headers["Retry-After"] = str(RETRY_AFTER_S)
        if rec.endpoint in (MESSAGES, RESPONSES):
            body = event_api_error_body(rec.endpoint, message, status)
        else:
            body = error_body(message, err_type, status)
        return web.Response(body=body, status=status, content_type="application/json", headers=headers)

    def _cut(self, request: web.Request, rec: TruthRecord, seq: SimSequence, resp: web.StreamResponse):
        """Close the connection mid-response: what was written stays, no terminator follows."""
        rec.completion_tokens = seq_sent = len(rec.t_chunks_ns)
        rec.fault_token_index = seq_sent if rec.fault_token_index is None else rec.fault_token_index
        rec.t_end_ns = time.perf_counter_ns()
        self.engine.abort(seq)
        self.counters.finished["abort"] += 1
        self._finish_record(rec, seq)
        resp.force_close()
        transport = request.transport
        if transport is not None:
            transport.close()  # flushes what was written, then FIN
        return resp

    def _client_gone(self, rec: TruthRecord, seq: SimSequence, resp: web.StreamResponse):
        rec.outcome = OUTCOME_CLIENT_GONE
        rec.t_end_ns = time.perf_counter_ns()
        self.engine.abort(seq)
        self.counters.finished["abort"] += 1
        self._finish_record(rec, seq)
        return resp

    # --- information endpoints ---------------------------------------------------------------
    def _serve_json(self, body_of):
        """A GET handler answering ``body_of(self)`` as JSON."""

        async def handler(_request: web.Request) -> web.Response:
            return _json(body_of(self))

        return handler

    async def _health(self, _request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _metrics(self, _request: web.Request) -> web.Response:
        text = render(metric_values(self.engine, self.counters), self.model_name, self.counters)
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    async def _dcgm_metrics(self, _request: web.Request) -> web.Response:
        # The page a dcgm-exporter beside the engine would serve: the modelled GPU power alone.
        text = "\n".join(render_dcgm(self._gpu_power(), self.server_id or "sim")) + "\n"
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    def _gpu_power(self) -> GpuPower:
        elapsed = time.perf_counter() - self._t0
        return gpu_power(self.engine, self.profile.name, elapsed, self.virtual_now(), self.time_scale, f"GPU-{self.server_id or 'sim'}")

    async def _sim_request(self, request: web.Request) -> web.Response:
        rec = self.truth.get(request.match_info["request_id"])
        if rec is None:
            return web.Response(
                status=404,
                body=error_body("no such request (unknown, or older than the records kept)", "NotFoundError", 404),
                content_type="application/json",
            )
        return web.Response(body=rec.to_json(), content_type="application/json")


def _reasoning(profile: Profile, endpoint: str, n: int, pieces: list[str] | None) -> int:
    """Reasoning tokens that open a reply of ``n`` tokens: the profile's, on chat, Messages and
    Responses replies of filler words (completions and a known question's answer have none),
    leaving at least one answer token."""
    if not profile.reasoning_tokens or endpoint == COMPLETIONS or pieces is not None:
        return 0
    return min(profile.reasoning_tokens, n - 1)


def _answer_text(seq: SimSequence, r: int, pieces: list[str] | None, tool: str | None) -> str:
    """A whole reply's answer after its ``r`` reasoning tokens: a known answer's words, the filler
    words, or with ``tool`` the call's arguments JSON made of them."""
    n = seq.max_tokens
    if pieces is not None:
        return "".join(pieces[:n])
    words = [WORDS_SPACED[w] for w in seq.words[r:n]]
    return arguments(words) if tool else "".join(words)


def _json(obj: object) -> web.Response:
    return web.Response(body=orjson.dumps(obj), content_type="application/json")


class EngineCrashed(RuntimeError):
    """The engine task died; the server stops rather than leave every request hanging."""


async def serve(config: SimConfig, host: str, port: int, stop: asyncio.Event, on_listening=None) -> None:
    """Run a sim until ``stop`` is set; ``on_listening(server)`` is called once bound.

    Raises ``EngineCrashed`` (after a clean shutdown) if the engine task fails.
    """
    server = SimServer(config)
    await server.start(host, port)
    stopper = asyncio.ensure_future(stop.wait())
    try:
        if on_listening is not None:
            on_listening(server)
        await asyncio.wait([stopper, server._driver], return_when=asyncio.FIRST_COMPLETED)
        if server._driver.done() and not server._driver.cancelled() and server._driver.exception():
            exc = server._driver.exception()
            logging.getLogger("targets.sim").error("engine loop crashed", exc_info=exc)  # a sim bug: show it
            raise EngineCrashed(f"the engine loop crashed: {type(exc).__name__}: {exc}") from exc
    finally:
        stopper.cancel()
        await server.stop()


def _client_port(request: web.Request) -> int | None:
    """The client's port of the connection that carried ``request`` (truth's ``client_port``)."""
    transport = request.transport
    peer = transport.get_extra_info("peername") if transport is not None else None
    return peer[1] if isinstance(peer, tuple) and len(peer) >= 2 else None
