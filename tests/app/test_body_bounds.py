"""Bodies at their exact bounds, in process, no model: a body of exactly LIDARSEG_MAX_BODY_BYTES,
bodies held up to LIDARSEG_MAX_BODIES_BYTES, and the close after an error answered before the
body was read. (From a hand-made mutation audit, 2026-12-06.)"""

from __future__ import annotations

import asyncio

import pytest

from app.service.accounting import RequestAccounting
from app.service.config import Settings
from app.service.routes.body import read_body
from app.service.state import ServiceError, ServiceState
from tests.app.inproc_helpers import asgi_request, ready_service


@pytest.mark.parametrize("declared", [True, False])
def test_a_body_of_exactly_max_body_bytes_is_read(declared):
    """body.py: the limit is inclusive, by Content-Length and while streaming; one byte more
    is 413."""
    limit = 1024

    async def read(size: int):
        service = ready_service(max_body_bytes=limit, max_bodies_bytes=4 * limit)
        body = b"\0" * size
        headers = [(b"content-length", str(size).encode())] if declared else []
        chunks = [body[:500], body[500:]]  # streamed in two pieces
        return await read_body(asgi_request(headers, chunks), service)

    assert len(asyncio.run(read(limit))) == limit
    with pytest.raises(ServiceError) as e:
        asyncio.run(read(limit + 1))
    assert (e.value.status, e.value.code) == (413, "body_too_large")


def test_bodies_may_fill_max_bodies_bytes_exactly():
    """state.py hold_body: bodies held at once may reach LIDARSEG_MAX_BODIES_BYTES (inclusive);
    a byte more is 503 bodies_busy (test_limits_capacity.py checks only 60 MiB + 60 MiB against
    100)."""
    service = ready_service(max_body_bytes=1024, max_bodies_bytes=2048)
    service.hold_body(1024)
    service.hold_body(1024)
    with pytest.raises(ServiceError) as e:
        service.hold_body(1)
    assert (e.value.status, e.value.code) == (503, "bodies_busy")
    service.release_body(1024)
    service.hold_body(1024)


@pytest.mark.parametrize(
    "framing",
    [(b"content-length", b"16"), (b"transfer-encoding", b"chunked")],
    ids=["content-length", "chunked"],
)
@pytest.mark.parametrize("status", [400, 415, 422])
def test_an_error_sent_before_the_body_was_read_closes_the_connection(status, framing):
    """accounting.py: Connection: close on every error (>= 400, 400 included) answered before the
    body was read, whether the body is declared by Content-Length or chunked (_has_body), so the
    unread rest is never taken for the next request (test_limits.py's chunked case is a 401,
    which closes by itself)."""
    service = ServiceState(Settings(weights="random", device="cpu"))
    sent: list[dict] = []

    async def refuses_unread(scope, receive, send):  # e.g. ?detail=nope: 400 before the body
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def receive():
        return {"type": "http.request", "body": b"\0" * 16, "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "path": "/v1/segment", "method": "POST",
             "headers": [framing]}  # fmt: skip
    asyncio.run(RequestAccounting(refuses_unread, service)(scope, receive, send))
    assert (b"connection", b"close") in sent[0]["headers"]
