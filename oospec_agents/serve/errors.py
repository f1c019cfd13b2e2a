"""OpenAI's error body for every failure, and the checks that run before a request reaches a route.

`{"error": {"message", "type", "param", "code"}}`: the message names the bad value. A 500 carries
no stack trace to the client; the trace goes to the log.
"""
from __future__ import annotations

import hmac
import json
import logging
import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from ..errors import ContextLengthError, OoOSpecError
from .protocol import RequestError
from .scheduler import QueueFull

log = logging.getLogger("oospec.serve")

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 405: "invalid_request_error", 413: "invalid_request_error",
          429: "rate_limit_error", 500: "server_error", 503: "service_unavailable_error"}


class ServeError(Exception):
    """An error with its HTTP status, raised anywhere in a route."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.param, self.code = status, param, code


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": _TYPES.get(status, "invalid_request_error"), "param": param,
                      "code": code}}


def error_response(status: int, message: str, param: str | None = None, code: str | None = None,
                   headers: dict | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, code), status_code=status, headers=headers)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    err = exc.errors()[0]
    loc = [str(p) for p in err.get("loc", ()) if p != "body"]
    if err.get("type") == "json_invalid":
        return f"the body is not valid JSON: {(err.get('ctx') or {}).get('error', err.get('msg'))}", None
    where = ".".join(loc) or "body"
    shown = "input" in err and loc and err.get("type") != "missing"  # a missing field's input is the whole body
    got = f" (got {json.dumps(err['input'], default=str)[:80]})" if shown else ""
    more = f"; and {len(exc.errors()) - 1} more problem(s)" if len(exc.errors()) > 1 else ""
    return f"{where}: {err.get('msg')}{got}{more}", where


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        message, param = _validation_message(exc)
        return error_response(400, message, param)

    @app.exception_handler(RequestError)
    async def _refused(request: Request, exc: RequestError):
        return error_response(400, str(exc), exc.param, exc.code)

    @app.exception_handler(OoOSpecError)
    async def _engine_refused(request: Request, exc: OoOSpecError):
        code = "context_length_exceeded" if isinstance(exc, ContextLengthError) else type(exc).__name__
        return error_response(400, str(exc), exc.param, code)

    @app.exception_handler(QueueFull)
    async def _full(request: Request, exc: QueueFull):
        return error_response(429, str(exc), None, "queue_full", headers={"Retry-After": "1"})

    @app.exception_handler(ServeError)
    async def _serve_error(request: Request, exc: ServeError):
        return error_response(exc.status, str(exc), exc.param, exc.code)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException):
        detail = exc.detail if exc.status_code != 404 else f"no route {request.method} {request.url.path}"
        return error_response(exc.status_code, str(detail))

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception):
        log.exception("request %s %s failed", request.method, request.url.path)
        return error_response(500, f"internal error ({type(exc).__name__}); the server log has the details")


class Guard:
    """ASGI middleware before the routes: the bearer key on /v1/, the body size limit, and the
    request count by status and the latency of chat completions."""

    def __init__(self, app, *, api_key: str | None, max_body_bytes: int, metrics, chat_path: str):
        self.app, self.api_key, self.max_body_bytes = app, api_key, max_body_bytes
        self.metrics, self.chat_path = metrics, chat_path

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0, status = time.perf_counter(), [500]

        async def counted_send(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            refusal = self._refusal(scope)
            if refusal is None and scope["method"] in ("POST", "PUT", "PATCH"):
                refusal, receive = await self._read_body(receive)
            if refusal is not None:
                return await refusal(scope, receive, counted_send)
            await self.app(scope, receive, counted_send)
        finally:
            if scope["path"] == self.chat_path:
                self.metrics.requests.labels(str(status[0])).inc()
                self.metrics.latency.observe(time.perf_counter() - t0)

    def _refusal(self, scope):
        headers = dict(scope["headers"])
        if self.api_key and scope["path"].startswith("/v1/"):
            auth = headers.get(b"authorization", b"").decode("latin-1")
            if not auth.lower().startswith("bearer "):
                return error_response(401, "missing API key: send the header 'Authorization: Bearer <key>'",
                                      code="invalid_api_key")
            if not hmac.compare_digest(auth[7:].strip().encode(), self.api_key.encode()):
                return error_response(401, "incorrect API key in the Authorization header", code="invalid_api_key")
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            return self._too_large(int(length))
        return None

    async def _read_body(self, receive):
        """Read the whole body (it may come chunked, without a length) up to the limit, then replay it."""
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None, receive  # the client left; the app sees the disconnect
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_body_bytes:
                return self._too_large(size, at_least=True), receive
            if not message.get("more_body"):
                break
        body, sent = b"".join(chunks), [False]

        async def replay():
            if not sent[0]:
                sent[0] = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()
        return None, replay

    def _too_large(self, size: int, at_least: bool = False):
        return error_response(413, f"the request body is {'over ' if at_least else ''}{size} bytes, over the "
                                   f"limit of {self.max_body_bytes} bytes (--max-body-bytes)",
                              code="request_too_large")
