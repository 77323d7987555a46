"""Contract testing of the in-process app against its own OpenAPI schema (schemathesis): every
operation, generated parameters and bodies; no 5xx, status codes and content types as
documented, JSON bodies matching their schemas (not "schema-valid data is accepted": a body the
schema allows, random bytes, is rarely a valid frame). Bounded: a fixed number of examples per
operation. The model is the small random one, loaded in process (no server)."""

from __future__ import annotations

import concurrent.futures
import contextlib

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402

from schemathesis.specs.openapi.checks import positive_data_acceptance  # noqa: E402

from app.service.config import Settings  # noqa: E402
from app.service.main import create_app, load_service  # noqa: E402


@contextlib.asynccontextmanager
async def _no_lifespan(_app):  # the state is set up once below, not per call
    yield


def _app():
    app = create_app(
        Settings(weights="random", cr=0.25, device="cpu", max_points=50_000, max_body_bytes=1 << 20)
    )
    service = app.state.service
    load_service(service)
    service.decoder = concurrent.futures.ThreadPoolExecutor(2)
    app.router.lifespan_context = _no_lifespan
    return app


APP = _app()
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)


@schema.parametrize()
@settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_api_conforms_to_its_schema(case):
    response = case.call()
    assert response.status_code < 500, (case.path, response.status_code, response.text[:300])
    # a schema-valid body is not a valid frame (the schema says "binary"): 4xx is right there
    case.validate_response(response, excluded_checks=[positive_data_acceptance])
