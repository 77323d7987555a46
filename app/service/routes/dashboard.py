"""The built-in dashboard (/dashboard), its JSON (/v1/requests, /v1/requests/{id}), the points of
a kept request for the 3D view, and /docs with Swagger UI served from the app (no CDN).

With API keys set, the page and its JSON need a key like /v1/*: `Authorization: Bearer <key>`,
or HTTP Basic with the key as the password (what a browser sends after its login prompt).
Static files (/static: the page's script and the vendored three.js, uPlot, Swagger UI) hold no
data and stay open.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, Response
from fastapi.staticfiles import StaticFiles

from app.codecs.files import RAW_LAYOUT_DEFAULT, RAW_LAYOUT_HINTS
from app.service.metrics import STAGES
from app.service.state import ServiceError
from app.service.auth import require_api_key
from app.service.routes.deps import ERROR_RESPONSES, Service, SettingsDep

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
SWAGGER = "/static/vendor/swagger-ui"


def require_key_browser(request: Request, settings: SettingsDep) -> None:
    """require_api_key, answering 401 with a Basic challenge so a browser asks for the key."""
    try:
        require_api_key(request, settings)
    except ServiceError as e:
        raise ServiceError(
            e.status,
            e.code,
            e.detail + " (in a browser: any user name, the key as password)",
            {"WWW-Authenticate": 'Basic realm="lidarseg", charset="UTF-8"'},
        ) from None


BrowserKey = Depends(require_key_browser)
router = APIRouter(tags=["dashboard"], dependencies=[BrowserKey])
AUTH: dict[int | str, dict[str, Any]] = {k: ERROR_RESPONSES[k] for k in (401,)}


def _ring(service):
    obs = getattr(service, "observe", None)
    if obs is None:
        raise ServiceError(404, "not_found", "no request ring in this app")
    return obs.ring


@router.get("/dashboard", include_in_schema=False)
def dashboard_page() -> FileResponse:
    return FileResponse(
        STATIC_DIR / "dashboard.html", media_type="text/html", headers={"Cache-Control": "no-store"}
    )


@router.get(
    "/v1/requests",
    summary="The last requests (newest first), latency percentiles and throughput",
    responses=AUTH,
)
async def list_requests(
    service: Service, limit: Annotated[int, Query(ge=1, le=100_000)] = 200
) -> dict:
    ring = _ring(service)
    return {
        "requests": ring.listing(limit),
        "stats": ring.stats(),
        "stages": [s for s in STAGES if s != "total"],
        "classes": _classes(service),
        # a dropped .bin file's raw layout by its name, as the command line reads one
        "raw_layouts": {"hints": RAW_LAYOUT_HINTS, "default": RAW_LAYOUT_DEFAULT},
    }


@router.get(
    "/v1/requests/{request_id}",
    summary="One recent request: stages, counts per class",
    responses={**AUTH, 404: ERROR_RESPONSES[400] | {"description": "Not in the ring"}},
)
async def get_request(request_id: str, service: Service) -> dict:
    ring = _ring(service)
    entry = ring.get(request_id)
    if entry is None:
        raise ServiceError(
            404, "not_found", f"request {request_id!r} is not among the last {ring.size} requests"
        )
    return {**ring.detail(entry), "classes": _classes(service)}


@router.get(
    "/v1/requests/{request_id}/points",
    summary="The kept points of a recent request: N x 3 float32 x, y, z (little "
    "endian), then N uint8 labels (255: ignored); X-Num-Points says N",
    response_class=Response,
    responses={**AUTH, 404: {"description": "Not kept"}},
)
async def get_points(request_id: str, service: Service) -> Response:
    ring = _ring(service)
    entry = ring.get(request_id)
    if entry is None or entry.points is None:
        raise ServiceError(
            404,
            "not_found",
            f"no points kept for request {request_id!r} "
            "(not among the last requests, over the memory budget, or keeping "
            "points is off: LIDARSEG_DASHBOARD_POINTS_MB)",
        )
    xyz = np.ascontiguousarray(entry.points[:, :3], dtype="<f4")
    labels = np.asarray(entry.labels).astype(np.uint8)
    return Response(
        xyz.tobytes() + labels.tobytes(),
        media_type="application/octet-stream",
        headers={"X-Num-Points": str(len(labels)), "Cache-Control": "no-store"},
    )


def _classes(service) -> list[dict]:
    return [
        {"id": i, "name": n, "color": list(c)}
        for i, (n, c) in enumerate(zip(service.class_names, service.class_colors))
    ]


docs_router = APIRouter()


@docs_router.get("/docs", include_in_schema=False)
def docs(request: Request) -> HTMLResponse:
    app = request.app
    return get_swagger_ui_html(
        openapi_url=app.openapi_url,
        title=f"{app.title} - API",
        swagger_js_url=f"{SWAGGER}/swagger-ui-bundle.js",
        swagger_css_url=f"{SWAGGER}/swagger-ui.css",
        swagger_favicon_url=f"{SWAGGER}/favicon-32x32.png",
    )


def mount(app: FastAPI) -> None:
    app.include_router(router)
    app.include_router(docs_router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
