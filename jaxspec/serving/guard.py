"""The guard: what a client may send is bounded before it costs the server anything.

`Guard` (ASGI middleware, in front of every route): the Host header against an allow-list (DNS
rebinding), the Origin (cross-site requests; CORS and its preflight for the origins allowed),
the API key. `read_body`: the body's size and the time it may take to arrive. `protocol`:
uvicorn's HTTP/1.1 protocol with a deadline for a request's headers, and OpenAI's error shape
for a request the HTTP layer cannot parse. `Limits` holds the operator's settings (`jaxspec
serve` flags); every refusal is an `openai.ApiError` answered by `error_response`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json

from jaxspec.errors import GenerationError
from jaxspec.serving.openai import ApiError

try:
    from starlette.requests import Request
    from starlette.responses import JSONResponse
except ImportError as e:  # pragma: no cover  (the CLI turns this into one line)
    raise ImportError("jaxspec serve needs starlette and uvicorn: pip install 'jaxspec[serve]'") from e


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


def error_response(e: ApiError) -> JSONResponse:
    """An `ApiError` as the HTTP response: its status and headers, OpenAI's error body."""
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


class Guard:
    """ASGI middleware: the Host allow-list, the Origin check (and CORS preflight when origins
    are allowed), the API key, in that order. Refusals are in OpenAI's error shape."""

    def __init__(self, app, limits: Limits):
        self.app, self.limits = app, limits

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        origin = headers.get("origin")
        refused = self.host_refusal(headers.get("host", "")) or self.origin_refusal(origin)
        if refused is not None:
            return await error_response(refused)(scope, receive, send)
        cors = {} if origin is None else {"access-control-allow-origin": origin, "vary": "Origin"}
        if cors and scope["method"] == "OPTIONS":
            preflight = JSONResponse({}, status_code=204, headers={
                **cors, "access-control-allow-methods": "GET, POST",
                "access-control-allow-headers": "authorization, content-type", "access-control-max-age": "600"})
            return await preflight(scope, receive, send)
        refused = self.key_refusal(headers.get("authorization", ""), scope["path"])
        if refused is not None:
            return await error_response(refused)(scope, receive, send)
        if not cors:
            return await self.app(scope, receive, send)

        async def send_cors(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []),
                                                  *((k.encode(), v.encode()) for k, v in cors.items())]}
            await send(message)

        return await self.app(scope, receive, send_cors)

    def host_refusal(self, host: str) -> ApiError | None:
        """A Host header the server does not answer to (DNS rebinding): a 403."""
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        name = name.strip("[]").lower()
        if "*" not in self.limits.allowed_hosts and name not in self.limits.allowed_hosts:
            return ApiError(403, f"Host {host!r} is not served here (--allowed-hosts)", code="host_not_allowed")
        return None

    def origin_refusal(self, origin: str | None) -> ApiError | None:
        """A browser origin the operator did not allow (a cross-site request): a 403."""
        allowed = self.limits.allowed_origins
        if origin is not None and origin not in allowed and "*" not in allowed:
            return ApiError(403, f"cross-origin requests from {origin!r} are not allowed (--allowed-origins)",
                            code="origin_not_allowed")
        return None

    def key_refusal(self, authorization: str, path: str) -> ApiError | None:
        """No API key, or a wrong one, where the server has one (every route but /health): a 401."""
        key = self.limits.api_key
        if key is None or path == "/health":
            return None
        token = authorization[7:] if authorization.lower().startswith("bearer ") else ""
        if not hmac.compare_digest(token.encode(), key.encode()):
            return ApiError(401, "a valid API key is needed: Authorization: Bearer <key>",
                            kind="invalid_request_error", code="invalid_api_key")
        return None


async def read_body(request: Request, limits: Limits) -> bytes:
    """The body, at most `max_body_bytes` (413), within `body_timeout_s` (408)."""
    length = request.headers.get("content-length")
    too_large = ApiError(413, f"the request body is larger than this server's limit of {limits.max_body_bytes} "
                         "bytes (--max-body-bytes)", code="request_too_large")
    if length is not None and (not length.isdigit() or int(length) > limits.max_body_bytes):
        raise too_large
    chunks, size = [], 0

    async def read():
        nonlocal size
        async for chunk in request.stream():
            size += len(chunk)
            if size > limits.max_body_bytes:
                raise too_large
            chunks.append(chunk)

    try:
        await asyncio.wait_for(read(), limits.body_timeout_s)
    except asyncio.TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {limits.body_timeout_s:g} s "
                       "(--body-timeout)", code="request_timeout") from None
    return b"".join(chunks)


def protocol(header_timeout_s: float):
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
