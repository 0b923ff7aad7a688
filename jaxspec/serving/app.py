"""`jaxspec serve`: an OpenAI-compatible HTTP server (Starlette on uvicorn) over the scheduler.

Routes: `POST /v1/chat/completions`, `POST /v1/completions` (both with `stream: true` as
server-sent events in OpenAI's chunk format, ending in `data: [DONE]`), `GET /v1/models`,
`GET /v1/models/{id}`, `GET /health`, `GET /metrics` (Prometheus' text format, `metrics`), and
vLLM's `POST /tokenize` and `POST /detokenize` (`tokens`). Every response carries a `jaxspec`
object beside OpenAI's fields: the method, the model steps, S (tokens per step), the token ids,
the seed, the time to the first token (the shapes: `openai`). vLLM's own request fields are
accepted where they change nothing (named in a `Warning` header), and `log_requests` writes one
line per answered completion on stderr.

`Server` holds the parts and the routes; a completion request is read and parsed, its jobs
submitted, and `Reply` answers it, whole or streamed. A client that disconnects cancels its job
(its slot is freed at the next chunk); SIGTERM stops accepting connections, lets the requests in
flight finish (uvicorn's graceful shutdown), then stops the scheduler.

What a client can send is bounded before it costs the server anything (`guard`: `Guard`,
`Limits`): the Host header (DNS rebinding), the Origin (cross-site requests), the API key, the
body's size and the time it may take to arrive (and the headers' time: `guard.protocol`); the
body is parsed and checked on a worker thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
import secrets
import signal
import socket
import sys
import time

import numpy as np

from jaxspec.serving import openai, tokens
from jaxspec.serving.guard import Guard, Limits, error_response, protocol, read_body
from jaxspec.serving.metrics import CONTENT_TYPE, Metrics
from jaxspec.serving.openai import ApiError
from jaxspec.serving.requests import Parsed, Requests, ServeSettings, ignored_fields, json_body
from jaxspec.serving.scheduler import Delta, Failure, Finish, Job, QueueFull, Scheduler

try:
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route
except ImportError as e:  # pragma: no cover  (the CLI turns this into one line)
    raise ImportError("jaxspec serve needs starlette and uvicorn: pip install 'jaxspec[serve]'") from e

DISCONNECT_POLL_S = 0.25
LISTEN_BACKLOG = 2048  # uvicorn's own default
log = logging.getLogger("jaxspec.serve")
# Seconds a refused request is told to wait (a queue that is full drains in about that on a busy server).
RETRY_AFTER_S = 5


@dataclasses.dataclass
class Answer:
    """One completion request as `/metrics` and `--log-requests` see it once it is answered."""

    ident: str
    endpoint: str
    arrived: float  # time.perf_counter() when the route began
    method: str = "-"
    prompt_tokens: int = 0
    finishes: list = dataclasses.field(default_factory=list)  # each choice's Finish, once all are in
    error: str | None = None  # the error's code (or type) of a refused or failed request


class Server:
    """The served model, its request parser and its scheduler, and the routes over them."""

    def __init__(self, model, settings: ServeSettings, eos_ids: tuple[int, ...], limits: Limits | None = None,
                 log_requests: bool = False, seed: int | None = None):
        self.model, self.settings, self.limits = model, settings, limits or Limits()
        self.log_requests = log_requests  # one line per answered completion on stderr
        # `seed`: the seeds of requests that give none are drawn from it (replayable in order)
        self.seeds = None if seed is None else np.random.default_rng(seed)
        # Bodies are decoded and checked here, one at a time, off the event loop (a plan's
        # first use resolves and binds its weights: one thread keeps that simple).
        self.parser = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="jaxspec-parse")
        self.requests = Requests(model, settings, eos_ids)
        self.scheduler = Scheduler(model, slots=settings.slots, context=settings.context,
                                   chunk_steps=settings.chunk_steps, max_groups=settings.max_groups,
                                   max_waiting=settings.max_waiting)
        self.started = int(time.time())
        self.auto_reason: str | None = None  # why `auto` chose the default method, when it did
        self.metrics = Metrics(self.scheduler, settings.context, settings.model_id)

    def warm(self) -> None:
        """Build the default plan's slot group (greedy, or sampled when the default temperature
        is not 0) before the first request, so it does not wait for compilation."""
        greedy = self.settings.temperature == 0
        plan = self.requests.plan(self.settings.method, dict(self.settings.method_options), greedy, False,
                                  step_modes=greedy and self.settings.step_modes)
        self.scheduler.group(plan, wait=True)

    # ----------------------------------------------------------------------------- routes
    async def health(self, request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "model": self.settings.model_id, **self.scheduler.status()})

    def _card(self) -> dict:
        return openai.model_card(self.settings.model_id, self.started, self.settings.context)

    async def models(self, request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [self._card()]})

    async def model_card(self, request: Request) -> JSONResponse:
        name = request.path_params["model_id"]
        if name != self.settings.model_id:
            return error_response(ApiError(404, f"the model {name!r} does not exist; this server serves "
                                           f"{self.settings.model_id!r}", "model", "model_not_found"))
        return JSONResponse(self._card())

    async def metrics_text(self, request: Request) -> Response:
        return Response(self.metrics.text(), media_type=CONTENT_TYPE)

    async def tokenize(self, request: Request):
        return await self._utility(request, "/tokenize", lambda body: tokens.tokenize(
            self.model, self.settings, body, self.requests.no_special_tokens))

    async def detokenize(self, request: Request):
        return await self._utility(request, "/detokenize", lambda body: tokens.detokenize(
            self.model, self.settings, body))

    async def _utility(self, request: Request, endpoint: str, work):
        """A route that answers from the tokenizer: the body read with the same limits, decoded
        and answered on the parser thread."""
        try:
            raw = await read_body(request, self.limits)
            answer = await asyncio.get_running_loop().run_in_executor(self.parser, lambda: work(json_body(raw)))
        except ApiError as e:
            self.metrics.request(endpoint, e.status)
            return error_response(e)
        except ClientDisconnect:
            self.metrics.request(endpoint, 499)
            return JSONResponse({}, status_code=499)
        self.metrics.request(endpoint, 200)
        return JSONResponse(answer)

    async def chat_completions(self, request: Request):
        return await self._complete(request, chat=True)

    async def completions(self, request: Request):
        return await self._complete(request, chat=False)

    async def _complete(self, request: Request, chat: bool):
        """A completion request: its body read and parsed, one job per choice submitted, then
        answered by a `Reply` (whole, or streamed)."""
        ident = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)
        answer = Answer(ident, "/v1/chat/completions" if chat else "/v1/completions", time.perf_counter())
        try:
            raw = await read_body(request, self.limits)
            parsed, ignored = await asyncio.get_running_loop().run_in_executor(self.parser, self._parse, raw, chat)
        except ApiError as e:
            return self._refused(answer, e)
        except ClientDisconnect:
            client = request.client
            log.warning("jaxspec: %s went away while sending its request body",
                        f"{client.host}:{client.port}" if client else "a client")
            self.record(answer, 499)
            return JSONResponse({}, status_code=499)
        answer.method, answer.prompt_tokens = parsed.plan.name, len(parsed.prompt)
        reply = Reply(self, parsed, answer)
        try:
            self.scheduler.submit(*reply.jobs)
        except QueueFull as e:
            return self._refused(answer, ApiError(503, str(e), kind="server_error", code="queue_full",
                                                  headers={"Retry-After": str(RETRY_AFTER_S)}))
        except RuntimeError as e:
            return self._refused(answer, ApiError(503, str(e), kind="server_error", code="shutting_down"))
        # RFC 7234's warning for what was accepted and ignored (299: a persistent warning)
        warning = {"Warning": f'299 - "ignored fields (they change nothing here): {", ".join(ignored)}"'} \
            if ignored else {}
        if parsed.stream:
            return StreamingResponse(reply.stream(), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", **warning})
        response = await reply.whole(request)
        if response.status_code == 200:
            response.headers.update(warning)
        self.record(answer, response.status_code, parsed, reply.jobs)
        return response

    def _parse(self, raw: bytes, chat: bool) -> tuple[Parsed, list[str]]:
        """The checked request, and the vLLM fields it gave that are ignored."""
        body = json_body(raw)
        parsed = self.requests.parse(body, chat)
        if self.seeds is not None and body.get("seed") is None:  # (--seed: drawn in the order they come)
            parsed.seed = int(self.seeds.integers(0, 2**32))
        return parsed, ignored_fields(body, chat)

    def _refused(self, answer: Answer, e: ApiError) -> JSONResponse:
        answer.error = e.code or e.kind
        self.record(answer, e.status)
        return error_response(e)

    def record(self, answer: Answer, status: int, parsed: Parsed | None = None, jobs: list[Job] = ()) -> None:
        """A completion request is answered (or refused): its metrics, and its log line."""
        now = time.perf_counter()
        self.metrics.request(answer.endpoint, status)
        done = status == 200 and parsed is not None and len(answer.finishes) == len(jobs)
        if done:
            self.metrics.completion(answer.endpoint, parsed.plan, len(parsed.prompt), answer.finishes, jobs,
                                    answer.arrived, now)
        if self.log_requests:
            reasons = ",".join(f.reason for f in answer.finishes) if done else "-"
            completion = sum(len(f.token_ids) for f in answer.finishes) if done else 0
            line = (f"jaxspec: request {answer.ident} {answer.endpoint} method={answer.method} "
                    f"prompt_tokens={answer.prompt_tokens} completion_tokens={completion} finish={reasons} "
                    f"latency_ms={(now - answer.arrived) * 1000:.1f} status={status}")
            print(line + (f" error={answer.error}" if answer.error else ""), file=sys.stderr, flush=True)

    # ----------------------------------------------------------------------------- app
    def app(self) -> "Starlette":
        async def not_found(request: Request, exc: HTTPException):
            return error_response(ApiError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}",
                                           code="not_found" if exc.status_code == 404 else None))

        async def internal(request: Request, exc: Exception):
            # The exception's text goes to the log under an id, never to the client (it may quote paths).
            ident = secrets.token_hex(6)
            log.error("jaxspec: internal error %s on %s %s", ident, request.method, request.url.path,
                      exc_info=(type(exc), exc, exc.__traceback__))
            self.metrics.request(request.url.path, 500)
            return error_response(ApiError(500, f"internal error {ident} (the server's log has it)",
                                           kind="server_error", code="internal_error"))

        routes = [Route("/health", self.health), Route("/metrics", self.metrics_text), Route("/v1/models", self.models),
                  Route("/v1/models/{model_id:path}", self.model_card),
                  Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
                  Route("/v1/completions", self.completions, methods=["POST"]),
                  Route("/tokenize", self.tokenize, methods=["POST"]),
                  Route("/detokenize", self.detokenize, methods=["POST"])]
        @contextlib.asynccontextmanager
        async def lifespan(app):
            yield
            self.scheduler.stop()  # after uvicorn's drain: nothing is in flight any more

        return Guard(Starlette(routes=routes, exception_handlers={HTTPException: not_found, Exception: internal},
                               lifespan=lifespan), self.limits)


class Reply:
    """The answer to one completion request: its jobs (one per choice, each in its own slot, with
    seeds seed, seed + 1, ...), the events they deliver, and the answer built from them, whole
    (`whole`: one body once every choice has finished) or streamed (`stream`: a chunk per event).
    The jobs are cancelled when the client goes away or a choice fails; the server records the
    answer (`Server.record`)."""

    def __init__(self, server: Server, parsed: Parsed, answer: Answer):
        self.server, self.parsed, self.answer = server, parsed, answer
        loop = asyncio.get_running_loop()
        self.events: asyncio.Queue = asyncio.Queue()  # (choice index, event) of every choice's job
        self.jobs = [Job(prompt=parsed.prompt, limit=parsed.limit, seed=(parsed.seed + i) % 2**32,  # (2**32 wraps)
                         sampling=parsed.sampling, plan=parsed.plan,
                         deliver=lambda ev, i=i: loop.call_soon_threadsafe(self.events.put_nowait, (i, ev)),
                         stop_strings=parsed.stop_strings, stop_ids=parsed.stop_ids) for i in range(parsed.n)]

    def cancel(self) -> None:
        for job in self.jobs:
            self.server.scheduler.cancel(job)

    async def whole(self, request: Request) -> JSONResponse:
        """The answer once every choice has finished (499 if the client went away first, 500 if
        decoding failed)."""
        finishes: dict[int, Finish] = {}
        while len(finishes) < len(self.jobs):
            try:
                i, event = await asyncio.wait_for(self.events.get(), DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    self.cancel()
                    return JSONResponse({}, status_code=499)
                continue
            if isinstance(event, Failure):
                self.cancel()
                self.answer.error = "server_error"
                return error_response(ApiError(500, event.message, kind="server_error"))
            if isinstance(event, Finish):
                finishes[i] = event
        self.answer.finishes = [finishes[i] for i in range(len(self.jobs))]
        return JSONResponse(openai.completion(self.answer.ident, self.server.settings.model_id, self.parsed,
                                              self.answer.finishes, self.server.model.tokenizer))

    async def stream(self):
        """Server-sent events: the role first (chat), a chunk per delta of text (or logprobs), a
        last chunk per choice with its finish reason and `jaxspec` object, the usage chunk when
        asked for, then `[DONE]`; a failure is an error event, then `[DONE]`."""
        parsed, answer, tokenizer = self.parsed, self.answer, self.server.model.tokenizer
        finishes: dict[int, Finish] = {}
        sent: dict[int, list[int]] = {i: [] for i in range(len(self.jobs))}  # each choice's tokens so far

        def chunk(i: int, text: str | None, **kwargs) -> str:
            return openai.sse(openai.chunk(answer.ident, self.server.settings.model_id, parsed, i, text,
                                           sent_tokens=sum(map(len, sent.values())), **kwargs))

        try:
            if parsed.chat:
                for i in range(len(self.jobs)):
                    yield chunk(i, "", role=True)  # the role first, as OpenAI does
            while len(finishes) < len(self.jobs):
                i, event = await self.events.get()
                if isinstance(event, Delta):
                    offset = len(tokenizer.decode(sent[i])) if tokenizer and sent[i] else 0
                    logprobs = openai.logprobs_body(tokenizer, parsed, event.token_ids, event.logprobs,
                                                    parsed.prompt + sent[i], offset)
                    sent[i] += event.token_ids
                    if event.text or logprobs:
                        yield chunk(i, event.text, logprobs=logprobs)
                    continue
                if isinstance(event, Finish):
                    finishes[i] = event
                    yield chunk(i, None, reason=event.reason, jaxspec=openai.extension(parsed, event))
                    continue
                self.cancel()
                answer.error = "server_error"
                yield openai.sse(ApiError(500, event.message, kind="server_error").body())
                yield openai.DONE
                return
            if parsed.include_usage:
                yield openai.sse(openai.usage_chunk(answer.ident, self.server.settings.model_id, parsed,
                                                    list(finishes.values())))
            yield openai.DONE
            answer.finishes = [finishes[i] for i in range(len(self.jobs))]
        finally:
            if len(finishes) < len(self.jobs):  # the client went away (the response was cancelled or closed)
                self.cancel()
            # (a stream's status: 200 once [DONE] is sent after every choice, 500 when decoding
            # failed (an error event was sent), 499 when the client went away)
            status = 500 if answer.error else 200 if answer.finishes else 499
            self.server.record(answer, status, parsed, self.jobs)


def _config(server: "Server", **kwargs):
    import uvicorn

    return uvicorn.Config(server.app(), log_level="warning", http=protocol(server.limits.header_timeout_s),
                          **kwargs)


def listen(host: str, port: int) -> socket.socket:
    """The listening socket (port 0: a free one), bound before uvicorn starts so the address is
    known, and listening already: a client that connects once the address is printed waits in
    the backlog until uvicorn accepts, instead of being refused while uvicorn starts up."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(LISTEN_BACKLOG)
    return sock


@contextlib.contextmanager
def background(server: Server, host: str = "127.0.0.1", port: int = 0):
    """Serve in a background thread (a notebook, a test): yields the base URL (`.../v1`); on
    exit the server drains and stops."""
    import threading

    import uvicorn

    sock = listen(host, port)
    bound = sock.getsockname()
    server.scheduler.start()
    uv = uvicorn.Server(_config(server))
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, name="jaxspec-http", daemon=True)
    thread.start()
    while not uv.started and thread.is_alive():
        time.sleep(0.02)
    try:
        yield f"http://{bound[0]}:{bound[1]}/v1"
    finally:
        uv.should_exit = True
        thread.join()
        server.scheduler.stop()


def run(server: Server, host: str, port: int, drain_seconds: float = 600.0, sock: socket.socket | None = None) -> None:
    """Serve until SIGINT / SIGTERM. `sock`: already bound (`listen`, before the model was
    loaded, so a busy port is said at once)."""
    import uvicorn

    sock = listen(host, port) if sock is None else sock
    bound = sock.getsockname()
    server.scheduler.start()
    config = _config(server, timeout_graceful_shutdown=drain_seconds)
    print(f"jaxspec: serving {server.settings.model_id} at http://{bound[0]}:{bound[1]}/v1 "
          f"({server.settings.slots} slots, context {server.settings.context})", file=sys.stderr, flush=True)
    # uvicorn drains on SIGINT / SIGTERM, then re-raises the signal: a drained stop exits 0.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    uvicorn.Server(config).run(sockets=[sock])
    print(f"jaxspec: stopped after {server.scheduler.counters['completed']} completed requests", file=sys.stderr)
