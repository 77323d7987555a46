"""Prometheus exposition (open, like the probes): the text format, or OpenMetrics (which carries
the exemplars: a trace id per histogram bucket) when the scraper's Accept header asks for it."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.openmetrics import exposition as openmetrics

from app.service.routes.deps import Service

router = APIRouter(tags=["metrics"])


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=Response,
    responses={
        200: {
            "content": {
                CONTENT_TYPE_LATEST: {"schema": {"type": "string"}},
                openmetrics.CONTENT_TYPE_LATEST: {"schema": {"type": "string"}},
            }
        }
    },
)
async def metrics(request: Request, service: Service) -> Response:  # event loop, no pool thread
    service.metrics.queue_depth.set(service.worker.depth if service.worker else 0)
    if "application/openmetrics-text" in request.headers.get("accept", ""):
        return Response(
            openmetrics.generate_latest(service.metrics.registry),
            media_type=openmetrics.CONTENT_TYPE_LATEST,
        )
    return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)
