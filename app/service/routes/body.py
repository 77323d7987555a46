"""Reading a request body under the service's limits (a multipart body's file part: multipart.py).

read_body: 415 for a Content-Encoding other than identity; 503 when the bodies read or held
at once would pass LIDARSEG_MAX_BODIES_BYTES (by Content-Length before reading, else while
streaming; released when the route answers: release_body); 413 as soon as the body passes
LIDARSEG_MAX_BODY_BYTES (by Content-Length before reading, else while streaming); 408 when the
whole body has not arrived within LIDARSEG_BODY_TIMEOUT_S; 503 draining when SIGTERM comes while
it is still arriving. Each of these closes the connection (Connection: close), so the rest of the
body is never read. A client that disconnects mid-body ends the request as 499 (never a 500,
never a traceback).
"""

from __future__ import annotations

import asyncio

from fastapi import Request
from starlette.requests import ClientDisconnect

from app.service.state import ServiceError, ServiceState

CLOSE = {"Connection": "close"}


def _declared_length(request: Request, limit: int) -> int | None:
    length = request.headers.get("content-length")
    if length is None:
        return None
    try:
        declared = int(length)
    except ValueError:
        raise ServiceError(
            400, "bad_content_length", f"Content-Length {length[:40]!r}", CLOSE
        ) from None
    if declared > limit:
        raise ServiceError(
            413,
            "body_too_large",
            f"body of {declared} bytes is over the limit of {limit} bytes",
            CLOSE,
        )
    return declared


def _hold(request: Request, service: ServiceState, size: int) -> None:
    """`size` bytes more of this request's body held (ServiceState.hold_body: 503 beyond
    LIDARSEG_MAX_BODIES_BYTES), given back by release_body when the route answers."""
    service.hold_body(size)
    request.state.body_held = getattr(request.state, "body_held", 0) + size


def release_body(request: Request, service: ServiceState) -> None:
    service.release_body(getattr(request.state, "body_held", 0))
    request.state.body_held = 0


def _identity_encoding(request: Request) -> None:
    """415 for a compressed body (Content-Encoding): nothing here inflates one, and read as it
    came it decodes to wrong points (a gzip of float32 rows of the right length did)."""
    lines = request.headers.getlist("content-encoding")  # every line, not only the first
    encoding = ", ".join(lines).lower()
    if any(coding.strip() not in ("", "identity") for coding in encoding.split(",")):
        raise ServiceError(
            415,
            "unsupported_content_encoding",
            f"Content-Encoding {encoding[:40]!r}: send the body uncompressed",
            CLOSE,
        )


async def read_body(request: Request, service: ServiceState) -> bytes:
    """The whole body, under the size limit, the body deadline and the drain (see above)."""
    settings = service.settings
    limit = settings.max_body_bytes
    _identity_encoding(request)
    declared = _declared_length(request, limit)
    _hold(request, service, declared or 0)  # a chunked body: chunk by chunk below
    task = asyncio.current_task()
    if task is None:  # pragma: no cover - a route always runs in a task
        raise RuntimeError("read_body must run in an asyncio task")
    reason: list[str] = []

    def stop(why: str) -> None:
        if not reason:
            reason.append(why)
            task.cancel()

    timer = asyncio.get_running_loop().call_later(settings.body_timeout_s, stop, "timeout")
    service.uploads[task] = stop
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ServiceError(
                    413,
                    "body_too_large",
                    f"body passed the limit of {limit} bytes while streaming",
                    CLOSE,
                )
            if declared is None:
                _hold(request, service, len(chunk))
            if chunk:  # Starlette's stream ends with b"": a body in one piece is then not copied
                chunks.append(chunk)
    except asyncio.CancelledError:
        if not reason:
            raise
        if hasattr(task, "uncancel"):
            task.uncancel()
        if reason[0] == "draining":
            raise ServiceError(
                503,
                "draining",
                "the server is shutting down; send the frame again",
                service.retry_after(close=True),
            ) from None
        raise ServiceError(
            408,
            "body_timeout",
            f"the body did not arrive within {settings.body_timeout_s} s (LIDARSEG_BODY_TIMEOUT_S)",
            CLOSE,
        ) from None
    except ClientDisconnect:
        raise ServiceError(
            499,
            "client_closed_request",
            "the client closed the connection before sending the whole body",
        ) from None
    finally:
        timer.cancel()
        service.uploads.pop(task, None)
    return b"".join(chunks)
