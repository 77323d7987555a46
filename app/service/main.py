"""The FastAPI app: create_app(settings) only builds it; the lifespan loads and warms the model
(in a background thread, so /healthz answers and /readyz says 503 meanwhile), starts the worker,
and on shutdown drains it."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.service import observe
from app.service.config import Settings
from app.service.routes import ROUTERS
from app.service.routes.deps import ServiceError, ServiceState

log = logging.getLogger("lidarseg")

API_VERSION = "1.0.0"


def warmup_frame(n: int = 4000, seed: int = 0) -> np.ndarray:
    """A small synthetic KITTI-like frame: a ground plane and a few boxes, with intensity."""
    rng = np.random.default_rng(seed)
    xy = rng.uniform(-20, 20, size=(n, 2)).astype(np.float32)
    z = np.where(rng.random(n) < 0.6, -1.7, rng.uniform(-1.7, 1.5, n)).astype(np.float32)
    return np.column_stack([xy, z, rng.random(n, dtype=np.float32)]).astype(np.float32)


def load_service(service: ServiceState) -> None:
    """Loads the model, builds the pipeline and the worker, runs a warm-up forward."""
    from kernels.tuning import DEFAULT_PATH

    from app.cli import load_model_meta
    from app.inference.pipeline import SegmentationPipeline
    from app.inference.voxelize import VoxelizeConfig
    from app.service.worker import InferenceWorker, WorkerStats

    settings = service.settings
    t0 = time.perf_counter()
    model, meta = load_model_meta(settings.weights, settings.cr)
    service.device = settings.torch_device
    service.class_names = list(meta["class_names"])
    service.class_colors = [list(c) for c in meta["class_colors"]]
    service.voxel_size = float(meta["voxel_size"])
    service.input_features = list(meta["input_features"])
    service.model_name, service.model_version = meta["name"], meta["version"]
    service.grouping_file = str(DEFAULT_PATH) if DEFAULT_PATH.exists() else None
    pipeline = SegmentationPipeline(
        model, VoxelizeConfig(voxel_size=service.voxel_size,
                              features=tuple(service.input_features)), service.device)
    pipeline.segment(warmup_frame(), "kitti")  # warm-up: kernels, allocator, OpenMP pool
    service.pipeline = pipeline
    metrics = service.metrics
    service.worker = InferenceWorker(
        pipeline, settings.queue_size, settings.max_batch, settings.max_wait_ms / 1e3,
        WorkerStats(on_batch=metrics.batch_size.observe, on_depth=metrics.queue_depth.set,
                    on_drop=metrics.dropped.inc,
                    on_run=service.observe.on_run if service.observe else None))
    metrics.model.info({"name": service.model_name, "version": service.model_version,
                        "device": service.device, "voxel_size": str(service.voxel_size),
                        "classes": str(len(service.class_names))})
    service.ready = True
    metrics.ready.set(1)
    log.info("model %s on %s loaded and warmed in %.1f s", service.model_tag, service.device,
             time.perf_counter() - t0)


def _load_in_background(service: ServiceState) -> None:
    try:
        load_service(service)
    except Exception as e:  # noqa: BLE001 - reported by /readyz, logged with the traceback
        service.load_error = f"{type(e).__name__}: {e}"
        log.exception("model load failed")


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI):
    service: ServiceState = app.state.service
    loader = threading.Thread(target=_load_in_background, args=(service,), name="lidarseg-load",
                              daemon=True)
    loader.start()
    try:
        yield
    finally:
        service.draining = True
        service.metrics.ready.set(0)
        await asyncio.to_thread(loader.join)
        if service.worker is not None:
            await asyncio.to_thread(service.worker.stop, service.settings.drain_timeout_s)
        service.observe.tracing.shutdown()  # flushes spans still batched for export
        log.info("drained; bye")


class RequestAccounting:
    """Pure ASGI middleware: counts /v1 requests in flight (the SIGTERM drain waits on it) and by
    status, and gives every response a Server-Timing header (at least `total`)."""

    def __init__(self, app, service: ServiceState):
        self.app, self.service = app, service

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        counted = scope["path"].startswith("/v1/")
        service = self.service
        if counted:
            with service.lock:
                service.in_flight += 1
                service.metrics.in_flight.set(service.in_flight)
        status = 500

        async def send_wrapper(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers", []))
                if not any(k.lower() == b"server-timing" for k, _ in headers):
                    dur = (time.perf_counter() - t0) * 1e3
                    headers.append((b"server-timing", f"total;dur={dur:.3f}".encode()))
                    message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            if counted:
                service.metrics.requests.labels(status=str(status)).inc()
                with service.lock:
                    service.in_flight -= 1
                    service.metrics.in_flight.set(service.in_flight)


def _error(status: int, code: str, detail: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": code, "detail": detail}, status_code=status, headers=headers)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    app = FastAPI(
        title="lidarseg", version=API_VERSION, lifespan=lifespan, docs_url=None, redoc_url=None,
        description="LiDAR semantic segmentation: POST a point-cloud frame, get a label per "
                    "point. Errors are JSON {\"error\": code, \"detail\": text}. With "
                    "LIDARSEG_API_KEYS set, /v1/* needs `Authorization: Bearer <key>`.")
    service = ServiceState(settings)
    app.state.service = service
    for router in ROUTERS:
        app.include_router(router)
    app.add_middleware(RequestAccounting, service=service)
    observe.install(app, service)  # traces, access log, /dashboard, /v1/requests, local /docs

    @app.exception_handler(ServiceError)
    async def service_error(_request: Request, exc: ServiceError):
        return _error(exc.status, exc.code, exc.detail, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request: Request, exc: RequestValidationError):
        detail = "; ".join(f"{'.'.join(map(str, e.get('loc', ())))}: {e.get('msg')}"
                           for e in exc.errors())
        return _error(400, "invalid_request", detail)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return _error(exc.status_code, code, str(exc.detail), getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def internal_error(_request: Request, exc: Exception):
        log.exception("unhandled error")
        return _error(500, "internal_error", f"{type(exc).__name__}: {exc}")

    return app
