"""Prometheus text exposition (open, like the probes)."""
from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from app.service.routes.deps import Service

router = APIRouter(tags=["metrics"])


@router.get("/metrics", summary="Prometheus metrics", response_class=Response,
            responses={200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}}})
def metrics(service: Service) -> Response:
    service.metrics.queue_depth.set(service.worker.depth if service.worker else 0)
    return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)
