"""What the routers share: typed dependencies (the service state, its settings, the API key
check) and the error responses their OpenAPI entries list.

get_service is the seam: every route reaches the service state through it (never through
request.app.state), so `app.dependency_overrides[get_service]` swaps it for every route, the key
checks included (tests/app/test_dependency_overrides.py). The settings travel with the state:
the routes' helpers and ServiceState's own methods read service.settings, so a test changes a
setting by overriding get_service with a ServiceState built from its own Settings. get_settings
follows get_service; overriding it alone reaches only SettingsDep's dependants (the dashboard's
key check), not /v1's key check (see _api_key), the body limits or the admission checks. The
middlewares and the lifespan hold the ServiceState create_app made: no override reaches them."""

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


async def _api_key(request: Request, service: Service) -> None:  # async: no pool thread
    # The service's settings, not SettingsDep: each dependency level costs FastAPI a pass over
    # the request's parameters (about 35 us on a Zen 1 core), on every call. Service is one the
    # /v1 routes resolve anyway (a cached leaf here): CPU time a request in process on the
    # 2-core Zen 4, against reading request.app.state, +6 to 10 us, through SettingsDep +12 to
    # 18 us. So an override of get_service reaches this check, one of get_settings alone not.
    require_api_key(request, service.settings)


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
