"""Liveness and readiness probes (never behind API keys)."""
from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from app.service.routes.deps import Service

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="Liveness: the process answers")
def healthz() -> dict[str, str]:
    return {"status": "alive"}


@router.get("/readyz", summary="Readiness: 200 once the model is loaded and warmed; 503 while "
            "starting and while draining", responses={503: {"description": "Not ready"}})
def readyz(service: Service):
    if service.ready and not service.draining:
        return {"status": "ready", "model": service.model_tag, "device": service.device}
    status = ("draining" if service.draining
              else "failed" if service.load_error else "starting")
    return JSONResponse({"status": status, "detail": service.load_error or status},
                        status_code=503, headers=service.retry_after())
