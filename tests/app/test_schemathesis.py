"""Contract testing of the in-process app against its own OpenAPI schema (schemathesis): every
operation, generated parameters and bodies; no 5xx, status codes and content types as
documented, JSON bodies matching their schemas (not "schema-valid data is accepted": a body the
schema allows, random bytes, is rarely a valid frame). Raw float32 frames, which schemathesis
cannot make, come from a strategy of their own, posted directly. Bounded: a fixed number of
examples per operation. The model is the small random one, loaded in process (no server)."""

from __future__ import annotations

import concurrent.futures
import contextlib

import numpy as np
import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from schemathesis.specs.openapi.checks import positive_data_acceptance  # noqa: E402

from app.service.config import Settings  # noqa: E402
from app.service.main import create_app, load_service  # noqa: E402
from app.service.routes.segment_api import SegmentResponse  # noqa: E402


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


# Raw float32 bodies (the media types schemathesis cannot generate itself): up to 40 records of
# x, y, z, intensity (any float32, NaN and infinities included), or a few stray bytes.
RAW_FRAMES = st.one_of(
    st.lists(st.tuples(*[st.floats(width=32)] * 4), max_size=40).map(
        lambda rows: np.asarray(rows, "<f4").reshape(-1, 4).tobytes()
    ),
    st.binary(max_size=40),
)
for media in ("application/x-kitti", "application/x-ouster"):
    schemathesis.openapi.media_type(media, RAW_FRAMES)

APP = _app()
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)


@schema.parametrize()
@settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_api_conforms_to_its_schema(case):
    response = case.call()
    assert response.status_code < 500, (case.path, response.status_code, response.text[:300])
    # a schema-valid body is not a valid frame (the schema says "binary"): 4xx is right there
    case.validate_response(response, excluded_checks=[positive_data_acceptance])


@given(
    body=RAW_FRAMES,
    fmt=st.sampled_from(["kitti", "ouster"]),
    binary=st.booleans(),
)
@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_raw_frames_get_answers_as_documented(body, fmt, binary):
    """Raw float32 bodies (the service's fast path, which schemathesis does not generate), most
    of them whole frames: 200 with one label per point, as documented, or a 4xx error body."""
    with TestClient(APP) as http:
        r = http.post(
            "/v1/segment",
            content=body,
            headers={
                "Content-Type": f"application/x-{fmt}",
                "Accept": "application/octet-stream" if binary else "application/json",
            },
        )
    points = len(body) // 16
    if not body or len(body) % 16:
        assert r.status_code == 400
        assert r.json()["error"] == ("malformed_body" if body else "empty_body")
        return
    xyz = np.frombuffer(body, "<f4").reshape(-1, 4)[:, :3]
    if not np.isfinite(xyz).all(axis=1).any():
        assert r.status_code == 422 and r.json()["error"] == "no_finite_points"
        return
    assert r.status_code == 200, r.text[:300]
    assert r.headers["x-num-points"] == str(points)
    if binary:
        assert len(r.content) == points
    else:
        answer = SegmentResponse.model_validate(r.json())
        assert len(answer.labels) == answer.num_points == points
        assert 0 <= answer.cleaned_points <= points
