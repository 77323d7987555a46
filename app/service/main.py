"""The FastAPI app: create_app(settings) only builds it; the lifespan loads and warms the model
(in a background thread, so /healthz answers and /readyz says 503 meanwhile), starts the worker
and the decode pool, and on shutdown drains them within the shutdown budget."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import logging
import os
import threading
import time

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.heap import worker_trim_hooks
from app.service import observe
from app.service.accounting import RequestAccounting, route_error
from app.service.config import Settings
from app.service.routes import ROUTERS
from app.service.state import ErrorBody, ServiceError, ServiceState

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

    from app.inference.builder import build_pipeline
    from app.inference.voxelize import voxelizer
    from app.service.worker import InferenceWorker, WorkerStats
    from app.threads import apply_threads

    settings = service.settings
    t0 = time.perf_counter()
    apply_threads(settings.compute_threads)
    service.device = settings.torch_device
    pipeline = build_pipeline(
        settings.weights,
        service.device,
        settings.cr,
        precision=settings.precision,
        deterministic=settings.deterministic,
    )
    meta = pipeline.meta
    service.class_names = list(meta["class_names"])
    service.class_colors = [list(c) for c in meta["class_colors"]]
    service.voxel_size = pipeline.voxel_config.voxel_size
    service.input_features = list(pipeline.voxel_config.features)
    service.model_name, service.model_version = meta["name"], meta["version"]
    service.model_licence = str(meta.get("licence") or "not stated in the checkpoint")
    service.training_data = str(meta.get("training_data") or "")
    service.grouping_file = DEFAULT_PATH.name if DEFAULT_PATH.exists() else None  # no paths
    pipeline.segment(warmup_frame(), "kitti")  # warm-up: kernels, allocator, OpenMP pool
    service.pipeline = pipeline
    metrics = service.metrics
    service.worker = InferenceWorker(
        pipeline,
        settings.queue_size,
        settings.max_batch,
        settings.max_wait_ms / 1e3,
        WorkerStats(
            on_batch=metrics.batch_size.observe,
            on_depth=metrics.queue_depth.set,
            on_drop=lambda reason: metrics.dropped.labels(reason=reason).inc(),
            on_restart=metrics.worker_restarts.inc,
            on_run=service.observe.on_run if service.observe else None,
        ),
        **worker_trim_hooks(settings.trim_after_points, settings.trim_idle_s),
        max_batch_points=settings.max_points,  # a batch's memory: that of one largest frame
    )
    metrics.model.info(
        {
            "name": service.model_name,
            "version": service.model_version,
            "device": service.device,
            "precision": pipeline.precision,
            "deterministic": str(pipeline.deterministic).lower(),
            "voxelizer": voxelizer(),  # torch.unique: Open3D did not load (alert on it)
            "voxel_size": str(service.voxel_size),
            "classes": str(len(service.class_names)),
        }
    )
    _freeze_heap()
    service.ready = True
    metrics.ready.set(1)
    log.info(
        "model %s on %s loaded and warmed in %.1f s",
        service.model_tag,
        service.device,
        time.perf_counter() - t0,
    )


def _freeze_heap() -> None:
    """Moves everything alive after loading (torch, the model, the app: about a million objects)
    out of the garbage collector's reach: a full collection then scans only what requests
    allocate, instead of pausing every thread for 40-110 ms (measured; a probe under a decode
    flood waited 190-280 ms behind one)."""
    gc.collect()
    gc.freeze()


def _lower_priority(niceness: int = 5) -> None:
    """Decode threads run a little nicer than the event loop (probes stay prompt while bodies
    are decoded); Linux gives each thread its own nice value."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), niceness)


def _load_in_background(service: ServiceState) -> None:
    try:
        load_service(service)
    except Exception as e:  # noqa: BLE001 - reported by /readyz, logged with the traceback
        service.load_error = f"{type(e).__name__}: {e}"
        log.exception("model load failed")


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI):
    service: ServiceState = app.state.service
    service.loop = asyncio.get_running_loop()
    service.decoder = concurrent.futures.ThreadPoolExecutor(
        service.settings.decode_slots,
        thread_name_prefix="lidarseg-decode",
        initializer=_lower_priority,
    )
    loader = threading.Thread(
        target=_load_in_background, args=(service,), name="lidarseg-load", daemon=True
    )
    loader.start()
    try:
        yield
    finally:
        if not service.draining:
            service.begin_drain(time.monotonic() + service.settings.shutdown_budget_s)
        await asyncio.to_thread(loader.join, service.drain_left())
        if service.worker is not None:
            await asyncio.to_thread(service.worker.stop, service.drain_left())
        service.decoder.shutdown(wait=False, cancel_futures=True)
        service.observe.tracing.shutdown()  # flushes spans still batched for export
        log.info("drained; bye")


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    app = FastAPI(
        # Traces, metrics and logs are the service's own (observe.py, tracing.py, metrics.py).
        # FastAPI's native OpenTelemetry would look up the global providers on every request
        # (about 15 us on a Zen 1 core) and add its own spans once anything set one.
        telemetry={"tracing": False, "metrics": False, "logs": False},
        title="lidarseg",
        version=API_VERSION,
        # /v1/segment/ is a 404 like any unknown path, not a 307 to a Location built from the
        # client's Host header
        redirect_slashes=False,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        description="LiDAR semantic segmentation: POST a point-cloud frame, get a label per "
        'point. Errors are JSON {"error": code, "detail": text}. With '
        "LIDARSEG_API_KEYS set, /v1/* (and /docs, /openapi.json unless "
        "LIDARSEG_OPEN_DOCS) need `Authorization: Bearer <key>`.",
    )
    service = ServiceState(settings)
    app.state.service = service
    for router in ROUTERS:
        app.include_router(router)
    _add_openapi(app)
    app.add_middleware(RequestAccounting, service=service)
    observe.install(app, service)  # traces, access log, /dashboard, /v1/requests, local /docs

    @app.exception_handler(ServiceError)
    async def serviceerror_response(request: Request, exc: ServiceError):
        return route_error(request, exc.status, exc.code, exc.detail, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def validationerror_response(request: Request, exc: RequestValidationError):
        detail = "; ".join(
            f"{'.'.join(map(str, e.get('loc', ())))}: {e.get('msg')}" for e in exc.errors()
        )
        return route_error(request, 400, "invalid_request", detail)

    @app.exception_handler(StarletteHTTPException)
    async def httperror_response(request: Request, exc: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        headers = getattr(exc, "headers", None)
        return route_error(request, exc.status_code, code, str(exc.detail), headers)

    return app


def _add_openapi(app: FastAPI) -> None:
    """/openapi.json (and /docs, from the dashboard routes) stay behind the API key when keys
    are set, unless LIDARSEG_OPEN_DOCS (RequestAccounting checks DOC_PATHS)."""
    app.openapi_url = "/openapi.json"  # for /docs; FastAPI's own route is not added
    generate = app.openapi

    def schema() -> dict:
        """FastAPI's schema, with parameter validation errors documented as what this app
        answers for them: 400 and an ErrorBody (FastAPI documents 422 for them)."""
        if app.openapi_schema is None:
            doc = generate()
            for path in doc.get("paths", {}).values():
                for op in path.values():
                    responses = op.get("responses", {})
                    if responses.get("422", {}).get("description") == "Validation Error":
                        del responses["422"]
                        responses.setdefault(
                            "400",
                            {
                                "description": "Malformed body or parameters",
                                "content": {
                                    "application/json": {
                                        "schema": {"$ref": "#/components/schemas/ErrorBody"}
                                    }
                                },
                            },
                        )
            doc.get("components", {}).setdefault("schemas", {}).setdefault(
                "ErrorBody", ErrorBody.model_json_schema()
            )
            app.openapi_schema = doc
        return app.openapi_schema

    # FastAPI's documented way to customise the schema: replace the instance's openapi()
    app.openapi = schema  # type: ignore[method-assign]

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())
