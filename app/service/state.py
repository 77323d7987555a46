"""The service's state (settings, metrics, model, worker, readiness, drain, held bodies) and its
JSON errors: what the app factory, the middlewares and the routes share."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from app.service.config import Settings
from app.service.metrics import Metrics


class ServiceError(Exception):
    """Answered as JSON {"error": code, "detail": detail} with `status` (and `headers`)."""

    def __init__(self, status: int, code: str, detail: str, headers: dict[str, str] | None = None):
        super().__init__(detail)
        self.status, self.code, self.detail, self.headers = status, code, detail, headers or {}


class ErrorBody(BaseModel):
    error: str
    detail: str


@dataclass
class ServiceState:
    settings: Settings
    metrics: Metrics = field(default_factory=Metrics)
    device: str = "cpu"
    pipeline: Any = None
    worker: Any = None
    model_name: str = ""
    model_version: str = ""
    model_licence: str = ""  # the checkpoint's meta["licence"] (terms of use of the weights)
    training_data: str = ""  # the checkpoint's meta["training_data"]
    class_names: list[str] = field(default_factory=list)
    class_colors: list[list[int]] = field(default_factory=list)
    voxel_size: float = 0.0
    input_features: list[str] = field(default_factory=list)
    grouping_file: str | None = None
    ready: bool = False
    draining: bool = False
    load_error: str | None = None
    in_flight: int = 0
    observe: Any = None  # app.service.observe.Observability (traces, log, ring)
    lock: threading.Lock = field(default_factory=threading.Lock)
    decoding: int = 0  # decodes running or waiting for a decode thread
    decoder: Any = None  # the decode thread pool (LIDARSEG_DECODE_CONCURRENCY)
    uploads: dict = field(default_factory=dict)  # task -> stop(reason): bodies being read
    body_bytes: int = 0  # of request bodies read or held now (event loop only: hold_body)
    loop: Any = None  # the event loop (set by the lifespan)
    shutdown_deadline: float = 0.0  # time.monotonic() by which the process exits

    def begin_drain(self, deadline: float) -> None:
        """SIGTERM: not ready, new work refused, uploads still arriving stopped (503)."""
        self.draining, self.shutdown_deadline = True, deadline
        self.metrics.ready.set(0)
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self._stop_uploads)

    def _stop_uploads(self) -> None:
        for stop in list(self.uploads.values()):
            stop("draining")

    def drain_left(self) -> float:
        """Seconds left of the shutdown budget (the full budget before a drain began)."""
        if not self.draining:
            return self.settings.shutdown_budget_s
        return max(0.0, self.shutdown_deadline - time.monotonic())

    @property
    def model_tag(self) -> str:
        return f"{self.model_name}:{self.model_version}"

    def retry_after(self, close: bool = False) -> dict[str, str]:
        """Retry-After (and Connection: close when the body is left unread)."""
        return {
            "Retry-After": str(self.settings.retry_after_s),
            **({"Connection": "close"} if close else {}),
        }

    def require_ready(self) -> None:
        if self.draining:
            raise ServiceError(
                503, "draining", "the server is shutting down", self.retry_after(close=True)
            )
        if not self.ready:
            detail = (
                "the model failed to load (see the server log)"
                if self.load_error
                else "the model is still loading"
            )
            raise ServiceError(503, "not_ready", detail, self.retry_after(close=True))

    def hold_body(self, size: int) -> None:
        """`size` more bytes of request bodies held (on the event loop); 503 + Retry-After and
        Connection: close beyond LIDARSEG_MAX_BODIES_BYTES. The route gives them back
        (release_body) when it answers."""
        limit = self.settings.max_bodies_bytes
        if self.body_bytes + size > limit:
            raise ServiceError(
                503,
                "bodies_busy",
                f"server busy: {self.body_bytes} bytes of bodies held, {size} more would pass "
                f"{limit} (LIDARSEG_MAX_BODIES_BYTES)",
                self.retry_after(close=True),
            )
        self.body_bytes += size

    def release_body(self, size: int) -> None:
        self.body_bytes -= size

    @property
    def worker_alive(self) -> bool:
        return self.worker is not None and self.worker.alive

    @property
    def fatal_error(self) -> str | None:
        """Why this process can never serve again (the server exits on it), or None."""
        if self.load_error is not None:
            return "the model could not be loaded"
        if self.ready and not self.draining and not self.worker_alive:
            return "the inference worker's thread has ended"
        return None
