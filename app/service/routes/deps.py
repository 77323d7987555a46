"""What the routers share: typed dependencies (the service state, its settings, the API key
check) and the error responses their OpenAPI entries list."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request

from app.service.auth import require_api_key
from app.service.config import Settings
from app.service.state import ErrorBody, ServiceState


async def get_service(request: Request) -> ServiceState:  # async: no pool thread
    return request.app.state.service


Service = Annotated[ServiceState, Depends(get_service)]


async def get_settings(service: Service) -> Settings:
    return service.settings


SettingsDep = Annotated[Settings, Depends(get_settings)]


async def _api_key(request: Request) -> None:  # async: no pool thread
    # The settings straight from the app, not through SettingsDep: each dependency level costs
    # FastAPI a pass over the request's parameters (about 35 us on a Zen 1 core), on every call.
    require_api_key(request, request.app.state.service.settings)


ApiKey = Depends(_api_key)

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": text}
    for code, text in (
        (400, "Malformed body or parameters"),
        (401, "Missing or invalid API key"),
        (408, "The body did not arrive within the body timeout"),
        (409, "Superseded: a newer frame of the same X-Stream-Id was queued before this one ran"),
        (413, "Body over the size limit, or too many points"),
        (415, "Unknown format, or a compressed body (Content-Encoding)"),
        (422, "Unusable values (no finite point, coordinates out of range)"),
        (503, "Queue full, decoders or bodies busy, starting or draining (see Retry-After)"),
        (504, "Deadline passed before the frame was segmented"),
    )
}
