"""RequestAccounting: the outermost middleware of every request (ids, the /v1 in-flight count the
SIGTERM drain waits on, counts by route, status and error code, the segment route's time for
every outcome, Server-Timing and X-Request-Id on every answer, Connection: close on early errors,
fixed 500s, and a JSON 503 for a request uvicorn's shutdown cancels)."""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid

from fastapi.responses import JSONResponse

from app.service.state import ServiceState
from app.service.auth import key_valid, unauthorized

log = logging.getLogger("lidarseg")

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
DOC_PATHS = ("/docs", "/openapi.json")
SEGMENT_ROUTE = "/v1/segment"
ERROR_KEY = "error_code"  # scope["state"][ERROR_KEY]: the error code of an error answer


class RequestAccounting:
    """Pure ASGI middleware: gives every request an id (X-Request-Id when it is sane, else a new
    one), counts /v1 requests in flight (the SIGTERM drain waits on it) and by status, gives every
    response a Server-Timing header (at least `total`), closes the connection on an error sent
    before the body was read (so the rest is never read), and turns an unexpected exception into
    a fixed 500 (details only in the log, with the request id)."""

    def __init__(self, app, service: ServiceState):
        self.app, self.service = app, service

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        rid = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"x-request-id"), "")
        rid = rid if _REQUEST_ID.match(rid) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = rid
        counted = scope["path"].startswith("/v1/")
        service = self.service
        if scope["path"] in DOC_PATHS and not self._docs_allowed(scope):
            exc = unauthorized()
            scope["state"][ERROR_KEY] = exc.code
            headers = {**(exc.headers or {}), "X-Request-Id": rid}
            return await error_response(exc.status, exc.code, exc.detail, headers)(
                scope, receive, send
            )
        if counted:
            self._count(+1)
        state = {"status": 500, "started": False, "body_done": not _has_body(scope), "rid": rid}
        app = _ambiguous_framing if _both_lengths(scope) else self.app

        async def receive_wrapper():
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                state["body_done"] = True
            return message

        async def send_wrapper(message):
            if message["type"] == "http.response.start":
                state["status"], state["started"] = message["status"], True
                message = {**message, "headers": self._headers(message, t0, state)}
            await send(message)

        try:
            await app(scope, receive_wrapper, send_wrapper)
        except asyncio.CancelledError:
            if not state["started"] and service.draining:
                # uvicorn's shutdown cancels what outlasts the budget's drain: a JSON 503, and the
                # task ends (re-raised, uvicorn would answer a text/plain 500 and log a traceback)
                state["status"] = 503
                scope["state"][ERROR_KEY] = "draining"
                await error_response(
                    503,
                    "draining",
                    f"the server shut down before this request finished (request id {rid})",
                    service.retry_after(close=True),
                )(scope, receive, send_wrapper)
                return
            state["status"] = 499  # the server cancelled it (forced exit): not a server error
            raise
        except Exception:  # noqa: BLE001 - answered with a fixed message, logged with the id
            log.exception("request %s: unhandled error", rid)
            scope["state"][ERROR_KEY] = "internal_error"
            if not state["started"]:
                await error_response(
                    500,
                    "internal_error",
                    f"internal error (request id {rid})",
                    {"X-Request-Id": rid},
                )(scope, receive, send_wrapper)
        finally:
            if counted:
                self._account(scope, str(state["status"]), time.perf_counter() - t0)
                self._count(-1)

    def _account(self, scope, status: str, seconds: float) -> None:
        """The /v1 request's counts: by route (its template: bounded, whatever the paths
        clients send), status and error code; the segment route's time whatever its outcome
        (the stage histograms see only answered frames)."""
        metrics = self.service.metrics
        route = getattr(scope.get("route"), "path", None)
        if route is None:  # answered before routing (ambiguous framing): the segment route's own
            route = SEGMENT_ROUTE if scope["path"] == SEGMENT_ROUTE else "other"
        metrics.requests.labels(route=route, status=status).inc()
        code = scope["state"].get(ERROR_KEY)
        if code is not None:
            metrics.errors.labels(route=route, code=code).inc()
        if route == SEGMENT_ROUTE:
            metrics.segment_seconds.labels(status=status).observe(seconds)

    def _docs_allowed(self, scope) -> bool:
        settings = self.service.settings
        if settings.open_docs or not settings.api_keys:
            return True
        auth = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"authorization"), "")
        return key_valid(auth, settings.api_keys)

    def _count(self, step: int) -> None:
        with self.service.lock:
            self.service.in_flight += step
            self.service.metrics.in_flight.set(self.service.in_flight)

    @staticmethod
    def _headers(message, t0: float, state: dict) -> list:
        headers = list(message.get("headers", []))
        names = {k.lower() for k, _ in headers}
        if b"server-timing" not in names:
            dur = (time.perf_counter() - t0) * 1e3
            headers.append((b"server-timing", f"total;dur={dur:.3f}".encode()))
        if b"x-request-id" not in names:  # errors too: the id a client quotes in a report
            headers.append((b"x-request-id", state["rid"].encode()))
        if message["status"] >= 400 and not state["body_done"] and b"connection" not in names:
            headers.append((b"connection", b"close"))
        return headers


def _both_lengths(scope) -> bool:
    """A request with both Content-Length and Transfer-Encoding (RFC 9112 6.1: a server may
    refuse it, and must close after answering). h11 reads the chunks and ignores the length, but
    the length is what the body's memory hold and the inline-decode choice would go by: a
    chunked body of any size behind `Content-Length: 4`."""
    names = {k for k, _ in scope["headers"]}
    return b"content-length" in names and b"transfer-encoding" in names


async def _ambiguous_framing(scope, receive, send) -> None:
    scope["state"][ERROR_KEY] = "ambiguous_framing"
    detail = "both Content-Length and Transfer-Encoding: send one"
    headers = {"Connection": "close"}  # RFC 9112 6.1: closed after the answer, whatever the length
    await error_response(400, "ambiguous_framing", detail, headers)(scope, receive, send)


def _has_body(scope) -> bool:
    for k, v in scope["headers"]:
        if k == b"content-length":
            return v.strip() not in (b"0", b"")
        if k == b"transfer-encoding":
            return True
    return False


def error_response(
    status: int, code: str, detail: str, headers: dict | None = None
) -> JSONResponse:
    return JSONResponse({"error": code, "detail": detail}, status_code=status, headers=headers)


def route_error(
    request, status: int, code: str, detail: str, headers: dict | None = None
) -> JSONResponse:
    """error_response for an exception handler, its code noted for RequestAccounting's
    counts (lidarseg_errors_total) and the access log."""
    setattr(request.state, ERROR_KEY, code)
    return error_response(status, code, detail, headers)
