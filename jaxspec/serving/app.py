"""`jaxspec serve`: an OpenAI-compatible HTTP server (Starlette on uvicorn) over the scheduler.

Routes: `POST /v1/chat/completions`, `POST /v1/completions` (both with `stream: true` as
server-sent events in OpenAI's chunk format, ending in `data: [DONE]`), `GET /v1/models`,
`GET /v1/models/{id}`, `GET /health`, `GET /metrics` (Prometheus' text format, `metrics`), and
vLLM's `POST /tokenize` and `POST /detokenize` (`tokens`). Every response carries a `jaxspec`
object beside OpenAI's fields: the method, the model steps, S (tokens per step), the token ids,
the seed, the time to the first token. vLLM's own request fields are accepted where they change
nothing (named in a `Warning` header), and `log_requests` writes one line per answered
completion on stderr.

A client that disconnects cancels its job (its slot is freed at the next chunk); SIGTERM
stops accepting connections, lets the requests in flight finish (uvicorn's graceful
shutdown), then stops the scheduler.

What a client can send is bounded before it costs the server anything (`Guard`, `Limits`):
the Host header (DNS rebinding), the Origin (cross-site requests), the API key, the body's
size and the time it may take to arrive (and the headers' time: `_Protocol`); the body is
parsed and checked on a worker thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import hmac
import itertools
import json
import logging
import secrets
import signal
import socket
import sys
import time

import numpy as np

from jaxspec.errors import GenerationError
from jaxspec.serving import tokens
from jaxspec.serving.metrics import CONTENT_TYPE, Metrics
from jaxspec.serving.requests import ApiError, Parsed, Requests, ServeSettings, ignored_fields
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


def _error(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


@dataclasses.dataclass
class _Answer:
    """One completion request as `/metrics` and `--log-requests` see it once it is answered."""

    ident: str
    endpoint: str
    arrived: float  # time.perf_counter() when the route began
    method: str = "-"
    prompt_tokens: int = 0
    finishes: list = dataclasses.field(default_factory=list)  # each choice's Finish, once all are in
    error: str | None = None  # the error's code (or type) of a refused or failed request


@dataclasses.dataclass(frozen=True)
class Limits:
    """Who may talk to the server and how much they may send (`jaxspec serve` flags)."""

    api_key: str | None = None  # required as `Authorization: Bearer <key>` (not on /health)
    allowed_hosts: tuple[str, ...] = ("127.0.0.1", "localhost", "::1")  # Host header names; "*": any
    allowed_origins: tuple[str, ...] = ()  # browser origins allowed (CORS); none: cross-origin refused
    max_body_bytes: int = 1 << 20
    body_timeout_s: float = 30.0  # the whole body, once the headers are in
    header_timeout_s: float = 10.0  # a connection's request headers, from connect (or the last answer)

    def __post_init__(self):
        # An empty key would be matched by a request with no Authorization header: refused, as the CLI does.
        if self.api_key is not None and (not isinstance(self.api_key, str) or not self.api_key.strip()):
            raise GenerationError("Limits.api_key is empty: give a key, or None for no key")


def default_hosts(host: str) -> tuple[str, ...]:
    """The bound address and localhost's names (a server bound to all interfaces answers only to
    those names until the operator lists its public ones)."""
    return tuple(dict.fromkeys((host.strip("[]"), "127.0.0.1", "localhost", "::1")))


class Guard:
    """ASGI middleware: the Host allow-list, the Origin check (and CORS preflight when origins
    are allowed), the API key. Refusals are in OpenAI's error shape."""

    def __init__(self, app, limits: Limits):
        self.app, self.limits = app, limits

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        lim = self.limits
        host = headers.get("host", "")
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        name = name.strip("[]").lower()
        if "*" not in lim.allowed_hosts and name not in lim.allowed_hosts:
            return await _error(ApiError(403, f"Host {host!r} is not served here (--allowed-hosts)",
                                         code="host_not_allowed"))(scope, receive, send)
        origin = headers.get("origin")
        cors = {}
        if origin is not None:
            if origin not in lim.allowed_origins and "*" not in lim.allowed_origins:
                return await _error(ApiError(403, f"cross-origin requests from {origin!r} are not allowed "
                                             "(--allowed-origins)", code="origin_not_allowed"))(scope, receive, send)
            cors = {"access-control-allow-origin": origin, "vary": "Origin"}
            if scope["method"] == "OPTIONS":
                preflight = JSONResponse({}, status_code=204, headers={
                    **cors, "access-control-allow-methods": "GET, POST",
                    "access-control-allow-headers": "authorization, content-type", "access-control-max-age": "600"})
                return await preflight(scope, receive, send)
        if lim.api_key is not None and scope["path"] != "/health":
            given = headers.get("authorization", "")
            token = given[7:] if given.lower().startswith("bearer ") else ""
            if not hmac.compare_digest(token.encode(), lim.api_key.encode()):
                return await _error(ApiError(401, "a valid API key is needed: Authorization: Bearer <key>",
                                             kind="invalid_request_error", code="invalid_api_key"))(scope, receive, send)
        if not cors:
            return await self.app(scope, receive, send)

        async def send_cors(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []),
                                                  *((k.encode(), v.encode()) for k, v in cors.items())]}
            await send(message)

        return await self.app(scope, receive, send_cors)


class Server:
    """The served model, its request parser and its scheduler."""

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
        return {"id": self.settings.model_id, "object": "model", "created": self.started, "owned_by": "jaxspec",
                "max_model_len": self.settings.context}

    async def models(self, request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [self._card()]})

    async def model_card(self, request: Request) -> JSONResponse:
        name = request.path_params["model_id"]
        if name != self.settings.model_id:
            return _error(ApiError(404, f"the model {name!r} does not exist; this server serves "
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
            raw = await self._body(request)
            answer = await asyncio.get_running_loop().run_in_executor(self.parser, lambda: work(_json_body(raw)))
        except ApiError as e:
            self.metrics.request(endpoint, e.status)
            return _error(e)
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
        ident = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)
        answer = _Answer(ident, "/v1/chat/completions" if chat else "/v1/completions", time.perf_counter())
        try:
            raw = await self._body(request)
            parsed, ignored = await asyncio.get_running_loop().run_in_executor(self.parser, self._parse, raw, chat)
        except ApiError as e:
            return self._refused(answer, e)
        except ClientDisconnect:
            client = request.client
            log.warning("jaxspec: %s went away while sending its request body",
                        f"{client.host}:{client.port}" if client else "a client")
            self._answered(answer, 499)
            return JSONResponse({}, status_code=499)
        answer.method, answer.prompt_tokens = parsed.plan.name, len(parsed.prompt)
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()  # (choice index, event) of every choice's job
        # n choices: n jobs, each in its own slot, with seeds seed, seed + 1, ... (2**32 wraps)
        jobs = [Job(prompt=parsed.prompt, limit=parsed.limit, seed=(parsed.seed + i) % 2**32,
                    sampling=parsed.sampling, plan=parsed.plan,
                    deliver=lambda ev, i=i: loop.call_soon_threadsafe(events.put_nowait, (i, ev)),
                    stop_strings=parsed.stop_strings, stop_ids=parsed.stop_ids) for i in range(parsed.n)]
        try:
            self.scheduler.submit(*jobs)
        except QueueFull as e:
            return self._refused(answer, ApiError(503, str(e), kind="server_error", code="queue_full",
                                                  headers={"Retry-After": str(RETRY_AFTER_S)}))
        except RuntimeError as e:
            return self._refused(answer, ApiError(503, str(e), kind="server_error", code="shutting_down"))
        # RFC 7234's warning for what was accepted and ignored (299: a persistent warning)
        warning = {"Warning": f'299 - "ignored fields (they change nothing here): {", ".join(ignored)}"'} \
            if ignored else {}
        if parsed.stream:
            return StreamingResponse(self._stream(jobs, parsed, events, ident, answer),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache", **warning})
        response = await self._whole(request, jobs, parsed, events, ident, answer)
        if response.status_code == 200:
            response.headers.update(warning)
        self._answered(answer, response.status_code, parsed, jobs)
        return response

    def _refused(self, answer: _Answer, e: ApiError) -> JSONResponse:
        answer.error = e.code or e.kind
        self._answered(answer, e.status)
        return _error(e)

    def _answered(self, answer: _Answer, status: int, parsed: Parsed | None = None, jobs: list[Job] = ()) -> None:
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

    async def _body(self, request: Request) -> bytes:
        """The body, at most `max_body_bytes` (413), within `body_timeout_s` (408)."""
        lim = self.limits
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > lim.max_body_bytes):
            raise ApiError(413, f"the request body is larger than this server's limit of {lim.max_body_bytes} "
                           "bytes (--max-body-bytes)", code="request_too_large")
        chunks, size = [], 0

        async def read():
            nonlocal size
            async for chunk in request.stream():
                size += len(chunk)
                if size > lim.max_body_bytes:
                    raise ApiError(413, f"the request body is larger than this server's limit of "
                                   f"{lim.max_body_bytes} bytes (--max-body-bytes)", code="request_too_large")
                chunks.append(chunk)

        try:
            await asyncio.wait_for(read(), lim.body_timeout_s)
        except asyncio.TimeoutError:
            raise ApiError(408, f"the request body did not arrive within {lim.body_timeout_s:g} s "
                           "(--body-timeout)", code="request_timeout") from None
        return b"".join(chunks)

    def _parse(self, raw: bytes, chat: bool) -> tuple[Parsed, list[str]]:
        """The checked request, and the vLLM fields it gave that are ignored."""
        body = _json_body(raw)
        parsed = self.requests.parse(body, chat)
        if self.seeds is not None and body.get("seed") is None:  # (--seed: drawn in the order they come)
            parsed.seed = int(self.seeds.integers(0, 2**32))
        return parsed, ignored_fields(body, chat)

    # ----------------------------------------------------------------------------- answers
    def _extension(self, job: Job, parsed: Parsed, finish: Finish) -> dict:
        return {"method": parsed.plan.name, "options": _plain(parsed.plan.options.as_dict()), "seed": parsed.seed,
                "token_ids": finish.token_ids, "steps": finish.stats["steps"],
                "compression": finish.stats["compression"],
                "time_to_first_token": round(finish.stats["time_to_first_token"], 6),
                "seconds": round(finish.stats["seconds"], 6),
                "accept_histogram": finish.stats.get("accept_histogram", []),
                # steps without drafts (the server's auto: chunks its slots ran plain)
                "plain_steps": finish.stats.get("plain_steps", 0), "step_modes": parsed.plan.step_modes}

    def _usage(self, parsed: Parsed, finishes: list[Finish]) -> dict:
        n = sum(len(f.token_ids) for f in finishes)
        return {"prompt_tokens": len(parsed.prompt), "completion_tokens": n, "total_tokens": len(parsed.prompt) + n}

    def _logprobs(self, parsed: Parsed, ids: list[int], logprobs, context: list[int], offset: int = 0):
        """OpenAI's logprobs object for `ids` (chat: `{"content": [...]}`; a completion: the
        legacy `tokens` / `token_logprobs` / `top_logprobs` / `text_offset`), or None when the
        request asked for none. Each token's text is what it adds after the tokens before it."""
        if parsed.logprobs is None or logprobs is None:
            return None
        chosen, top_ids, top = logprobs
        k = parsed.logprobs
        pieces = token_pieces(self.model.tokenizer, context, ids, top_ids[:, :k])
        if parsed.chat:
            entry = lambda text, value: {"token": text, "logprob": float(value),  # noqa: E731
                                         "bytes": list(text.encode("utf-8"))}
            return {"content": [{**entry(text, chosen[j]), "top_logprobs": [entry(t, v) for t, v in zip(alts, top[j])]}
                                for j, (text, alts) in enumerate(pieces)]}
        offsets = list(itertools.accumulate([len(text) for text, _ in pieces], initial=offset))[:-1]
        return {"tokens": [text for text, _ in pieces], "token_logprobs": [float(v) for v in chosen],
                "top_logprobs": [{t: float(v) for t, v in zip(alts, top[j])} for j, (_, alts) in enumerate(pieces)],
                "text_offset": offsets}

    def _head(self, ident: str, chat: bool, chunk: bool) -> dict:
        kind = ("chat.completion" if chat else "text_completion") + (".chunk" if chunk and chat else "")
        return {"id": ident, "object": kind, "created": int(time.time()), "model": self.settings.model_id}

    async def _whole(self, request: Request, jobs: list[Job], parsed: Parsed, events: asyncio.Queue, ident: str,
                     answer: _Answer):
        finishes: dict[int, Finish] = {}
        while len(finishes) < len(jobs):
            try:
                i, event = await asyncio.wait_for(events.get(), DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    for job in jobs:
                        self.scheduler.cancel(job)
                    return JSONResponse({}, status_code=499)
                continue
            if isinstance(event, Failure):
                for job in jobs:
                    self.scheduler.cancel(job)
                answer.error = "server_error"
                return _error(ApiError(500, event.message, kind="server_error"))
            if isinstance(event, Finish):
                finishes[i] = event
        answer.finishes = [finishes[i] for i in range(len(jobs))]
        choices = []
        for i, job in enumerate(jobs):
            event = finishes[i]
            choice = {"index": i, "finish_reason": event.reason,
                      "logprobs": self._logprobs(parsed, event.token_ids, event.logprobs, parsed.prompt)}
            if parsed.chat:
                choice["message"] = {"role": "assistant", "content": event.text}
            else:
                choice["text"] = event.text
            if len(jobs) > 1:  # (each choice's own; the top-level extension is the first's)
                choice["jaxspec"] = self._extension(job, parsed, event)
            choices.append(choice)
        return JSONResponse({**self._head(ident, parsed.chat, False), "choices": choices,
                             "usage": self._usage(parsed, list(finishes.values())),
                             "jaxspec": self._extension(jobs[0], parsed, finishes[0])})

    async def _stream(self, jobs: list[Job], parsed: Parsed, events: asyncio.Queue, ident: str, answer: _Answer):
        def chunk(i: int, text: str | None, reason: str | None = None, role: bool = False, logprobs=None,
                  **extra) -> str:
            if parsed.chat:
                delta = {} if text is None else {"content": text}
                if role:
                    delta = {"role": "assistant", **delta}
                choice = {"index": i, "delta": delta, "finish_reason": reason, "logprobs": logprobs}
            else:
                choice = {"index": i, "text": text or "", "finish_reason": reason, "logprobs": logprobs}
            if parsed.continuous_usage:  # (vLLM's continuous_usage_stats: the tokens sent so far)
                done = sum(map(len, sent.values()))
                extra["usage"] = {"prompt_tokens": len(parsed.prompt), "completion_tokens": done,
                                  "total_tokens": len(parsed.prompt) + done}
            return _sse({**self._head(ident, parsed.chat, True), "choices": [choice], **extra})

        finishes: dict[int, Finish] = {}
        sent: dict[int, list[int]] = {i: [] for i in range(len(jobs))}  # each choice's tokens so far
        try:
            if parsed.chat:
                for i in range(len(jobs)):
                    yield chunk(i, "", role=True)  # the role first, as OpenAI does
            while len(finishes) < len(jobs):
                i, event = await events.get()
                if isinstance(event, Delta):
                    offset = len(self.model.tokenizer.decode(sent[i])) if self.model.tokenizer and sent[i] else 0
                    logprobs = self._logprobs(parsed, event.token_ids, event.logprobs, parsed.prompt + sent[i],
                                              offset)
                    sent[i] += event.token_ids
                    if event.text or logprobs:
                        yield chunk(i, event.text, logprobs=logprobs)
                    continue
                if isinstance(event, Finish):
                    finishes[i] = event
                    yield chunk(i, None, event.reason, jaxspec=self._extension(jobs[i], parsed, event))
                    continue
                for job in jobs:
                    self.scheduler.cancel(job)
                answer.error = "server_error"
                yield _sse(ApiError(500, event.message, kind="server_error").body())
                yield "data: [DONE]\n\n"
                return
            if parsed.include_usage:
                yield _sse({**self._head(ident, parsed.chat, True), "choices": [],
                            "usage": self._usage(parsed, list(finishes.values()))})
            yield "data: [DONE]\n\n"
            answer.finishes = [finishes[i] for i in range(len(jobs))]
        finally:
            if len(finishes) < len(jobs):  # the client went away (the response was cancelled or closed)
                for job in jobs:
                    self.scheduler.cancel(job)
            # (a stream's status: 200 once [DONE] is sent after every choice, 500 when decoding
            # failed (an error event was sent), 499 when the client went away)
            status = 500 if answer.error else 200 if answer.finishes else 499
            self._answered(answer, status, parsed, jobs)

    # ----------------------------------------------------------------------------- app
    def app(self) -> "Starlette":
        async def not_found(request: Request, exc: HTTPException):
            return _error(ApiError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}",
                                   code="not_found" if exc.status_code == 404 else None))

        async def internal(request: Request, exc: Exception):
            # The exception's text goes to the log under an id, never to the client (it may quote paths).
            ident = secrets.token_hex(6)
            log.error("jaxspec: internal error %s on %s %s", ident, request.method, request.url.path,
                      exc_info=(type(exc), exc, exc.__traceback__))
            self.metrics.request(request.url.path, 500)
            return _error(ApiError(500, f"internal error {ident} (the server's log has it)", kind="server_error",
                                   code="internal_error"))

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


def token_pieces(tokenizer, context: list[int], ids: list[int], alternatives) -> list[tuple[str, list[str]]]:
    """Per token of `ids` (after `context`): the text it adds, and the text each of its
    `alternatives` row would have added in its place. Decoded after the few tokens before it, so
    a leading space or a character split over byte tokens comes out as in the whole text."""
    if tokenizer is None:
        return [(str(t), [str(int(a)) for a in alts]) for t, alts in zip(ids, alternatives)]
    tokens = list(context) + list(ids)
    out = []
    for j, (t, alts) in enumerate(zip(ids, alternatives)):
        before = tokens[max(0, len(context) + j - 4):len(context) + j]
        base = tokenizer.decode(before)
        piece = lambda x: tokenizer.decode(before + [int(x)])[len(base):]  # noqa: E731
        out.append((piece(t), [piece(a) for a in alts]))
    return out


def _json_body(raw: bytes):
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as e:  # (JSONDecodeError, bad UTF-8, an int past the digit limit)
        raise ApiError(400, f"the request body is not valid JSON: {type(e).__name__}: {str(e)[:200]}") from None


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload)}\n\n"


def _plain(options: dict) -> dict:
    """Method options as JSON values (a loaded drafter is named by its folder)."""
    return {k: v if isinstance(v, (int, float, str, bool, type(None))) else str(v) for k, v in options.items()}


def _protocol(header_timeout_s: float):
    """uvicorn's HTTP/1.1 protocol with a deadline for a request's headers: a connection that
    has not sent a whole request head within `header_timeout_s` of connecting (or of its last
    answer) is closed, so slow or idle connections cannot pile up. A request the HTTP layer
    cannot parse (a header without a colon, a bad Content-Length or chunk size, no Host or two)
    gets the API's JSON error shape, not uvicorn's plain text."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class Protocol(H11Protocol):
        def send_400_response(self, msg: str) -> None:
            body = json.dumps(ApiError(400, "the HTTP request could not be parsed (malformed request line, headers "
                                       "or body framing)", code="bad_http_request").body()).encode()
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                       (b"connection", b"close")]
            for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"), h11.Data(data=body),
                          h11.EndOfMessage()):
                self.transport.write(self.conn.send(event))
            self.transport.close()

        def _arm(self):
            cycle = self.cycle
            self._header_timer = self.loop.call_later(header_timeout_s, self._headers_late, cycle)

        def _headers_late(self, cycle):
            if self.cycle is cycle and (cycle is None or cycle.response_complete) and not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport):
            super().connection_made(transport)
            self._arm()

        def on_response_complete(self):
            super().on_response_complete()
            self._arm()

        def connection_lost(self, exc):
            self._header_timer.cancel()
            super().connection_lost(exc)

    return Protocol


def _config(server: "Server", **kwargs):
    import uvicorn

    return uvicorn.Config(server.app(), log_level="warning", http=_protocol(server.limits.header_timeout_s),
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
