"""Liveness and readiness probes (never behind API keys). Both run on the event loop (async, no
pool thread, no sync dependency), so a busy decode pool cannot delay them."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from app.service.routes.deps import Service

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="Liveness: the process answers")
async def healthz() -> dict[str, str]:
    return {"status": "alive"}


@router.get(
    "/readyz",
    summary="Readiness: 200 once the model is loaded and warmed; 503 while "
    "starting, while draining and when the worker thread is not alive",
    responses={503: {"description": "Not ready"}},
)
async def readyz(service: Service):
    if service.ready and not service.draining and service.worker_alive:
        return {"status": "ready", "model": service.model_tag, "device": service.device}
    status = (
        "draining"
        if service.draining
        else "failed"
        if service.load_error
        else "worker_dead"
        if service.ready
        else "starting"
    )
    detail = "model failed to load (see the log)" if service.load_error else status
    return JSONResponse(
        {"status": status, "detail": detail}, status_code=503, headers=service.retry_after()
    )


# HEAD too (load balancers probe with it; it was a 405), answered as GET, kept out of the schema
for _path, _endpoint in (("/healthz", healthz), ("/readyz", readyz)):
    router.add_api_route(_path, _endpoint, methods=["HEAD"], include_in_schema=False)
