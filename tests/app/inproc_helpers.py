"""In-process stand-ins for the service's parts, no model and no server: a ready ServiceState
and a Starlette Request fed from a list of body chunks."""

from __future__ import annotations

from starlette.requests import Request

from app.service.config import Settings
from app.service.state import ServiceState


def ready_service(**settings) -> ServiceState:
    """A ServiceState marked ready (no model, no worker: set what a test needs)."""
    service = ServiceState(Settings(weights="random", device="cpu", **settings))
    service.ready = True
    return service


def asgi_request(headers: list[tuple[bytes, bytes]], chunks: list[bytes] | None = None) -> Request:
    """A POST /v1/segment whose body arrives as `chunks`, then a disconnect."""
    chunks = chunks or [b""]
    messages = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
        for i, c in enumerate(chunks)
    ]

    async def receive():
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    scope = {"type": "http", "method": "POST", "path": "/v1/segment", "headers": headers,
             "query_string": b""}  # fmt: skip
    return Request(scope, receive)
