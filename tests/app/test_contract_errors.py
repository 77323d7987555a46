"""The HTTP contract's refusals, in process: JSON error bodies with the app still serving after
each, 503 before the model is ready, API keys and the 'reject' range policy."""

from __future__ import annotations

import numpy as np
import pytest

from tests.app.contract_helpers import (
    BIN,
    NUSCENES,
    WANT_BIN,
    assert_error,
    assert_good,
    frame_bytes,
    limited_serving,
    serving,
)
from tests.conftest import load_frame, require_real_data

KEY = "test-key-0123456789"


@pytest.fixture(scope="module")
def http():
    with limited_serving() as client:
        yield client


# ---- errors --------------------------------------------------------------------------------


def test_errors_are_json_and_the_app_keeps_serving(http):
    assert_error(http.post("/v1/segment?format=kitti", content=b"\0" * 10, headers=BIN), 400)
    assert_good(http)
    assert_error(http.post("/v1/segment", content=b"", headers=BIN), 400, "empty_body")
    assert_error(http.post("/v1/segment?format=bogus", content=b"\0" * 16, headers=BIN), 415)
    assert_good(http)
    nan = np.full((100, 4), np.nan, np.float32)
    assert_error(
        http.post("/v1/segment?format=kitti", content=nan.tobytes(), headers=BIN),
        422,
        "no_finite_points",
    )
    assert_good(http)
    many = np.zeros((150_001, 3), np.float32)  # 1.8 MB: under the body limit, over max_points
    assert_error(
        http.post("/v1/segment?format=xyz", content=many.tobytes(), headers=BIN),
        413,
        "too_many_points",
    )
    big = b"\0" * (4 * 1024 * 1024 + 16)
    assert_error(
        http.post("/v1/segment?format=kitti", content=big, headers=BIN), 413, "body_too_large"
    )

    def chunks():  # no Content-Length: chunked transfer, refused while streaming
        for _ in range(80):
            yield b"\0" * 65536

    assert_error(
        http.post("/v1/segment?format=kitti", content=chunks(), headers=BIN), 413, "body_too_large"
    )
    bad_detail = http.post("/v1/segment?detail=nope", content=b"\0" * 16, headers=BIN)
    assert_error(bad_detail, 400, "invalid_request")
    assert "detail" in bad_detail.json()["detail"]
    long_format = http.post("/v1/segment?format=" + "k" * 33, content=b"\0" * 16, headers=BIN)
    assert_error(long_format, 400, "invalid_request")
    assert "format" in long_format.json()["detail"]
    assert_error(http.get("/v1/nothing"), 404, "not_found")
    assert_error(http.get("/v1/segment"), 405, "method_not_allowed")
    assert_good(http)


def test_not_ready_is_503_with_retry_after():
    """Before the lifespan has loaded the model (here: never started), /v1/* and /readyz say 503
    with Retry-After; /healthz answers."""
    from fastapi.testclient import TestClient

    from app.service.config import Settings
    from app.service.main import create_app

    client = TestClient(create_app(Settings(weights="random", cr=0.25, device="cpu")))
    r = client.post("/v1/segment?format=kitti", content=b"\0" * 16, headers=BIN)
    assert_error(r, 503, "not_ready")
    assert int(r.headers["retry-after"]) >= 1
    ready = client.get("/readyz")
    assert ready.status_code == 503 and ready.json()["status"] == "starting"
    assert client.get("/healthz").status_code == 200


# ---- API keys, range policy -----------------------------------------------------------------


def test_api_keys_and_range_policy():
    require_real_data()
    with serving(api_keys=f"{KEY},other-key-abcdefgh", range_policy="reject") as client:
        auth = {"Authorization": f"Bearer {KEY}"}
        # /v1/* closed without a valid key, probes and metrics open
        r = client.post("/v1/segment", content=frame_bytes(NUSCENES))
        assert_error(r, 401, "unauthorized")
        assert r.headers["www-authenticate"].startswith("Bearer")
        for bad in ("Bearer wrong-key!", "Basic " + KEY, KEY, "Bearer "):
            assert_error(client.get("/v1/model", headers={"Authorization": bad}), 401)
        assert client.get("/healthz").status_code == 200
        assert client.get("/readyz").status_code == 200
        assert client.get("/metrics").status_code == 200
        assert client.get("/v1/model", headers=auth).status_code == 200
        assert (
            client.get(
                "/v1/model", headers={"Authorization": "Bearer other-key-abcdefgh"}
            ).status_code
            == 200
        )
        # range policy 'reject': 422, then a good request still succeeds
        pts = np.array(load_frame(NUSCENES))[:3000, :3].copy()
        pts[0, 2] = 99.0
        assert_error(
            client.post("/v1/segment?format=xyz", content=pts.tobytes(), headers={**BIN, **auth}),
            422,
            "out_of_range",
        )
        r = client.post(
            "/v1/segment?format=xyz", content=pts[1:].tobytes(), headers={**WANT_BIN, **auth}
        )
        assert r.status_code == 200 and len(r.content) == 2999


def test_a_client_deadline_shorter_than_the_servers_is_kept(http):
    """X-Deadline-Ms: a frame that cannot be answered within the client's budget is a 504 that
    names it (never an answer seconds late); a longer one than LIDARSEG_DEADLINE_S leaves the
    server's; anything but a positive number of milliseconds is a 400."""
    body = frame_bytes(NUSCENES)
    late = http.post("/v1/segment?format=nuscenes", content=body,
                     headers={**WANT_BIN, "X-Deadline-Ms": "0.001"})  # fmt: skip
    assert "X-Deadline-Ms" in assert_error(late, 504, "deadline_exceeded")["detail"]
    ok = http.post("/v1/segment?format=nuscenes", content=body,
                   headers={**WANT_BIN, "X-Deadline-Ms": "600000"})  # fmt: skip
    assert ok.status_code == 200 and len(ok.content) == len(body) // 20
    for past_any_setting in ("1e309", " 6e5 "):  # too large for a float; spaces around
        r = http.post("/v1/segment?format=nuscenes", content=body,
                      headers={**WANT_BIN, "X-Deadline-Ms": past_any_setting})  # fmt: skip
        assert r.status_code == 200, r.text
    for bad in ("soon", "0", "-5", "nan", "inf", "1_000", "0x10", "+5", ".5"):
        r = http.post("/v1/segment?format=nuscenes", content=body,
                      headers={**WANT_BIN, "X-Deadline-Ms": bad})  # fmt: skip
        assert "X-Deadline-Ms" in assert_error(r, 400, "invalid_request")["detail"], bad
    twice = http.post(
        "/v1/segment?format=nuscenes",
        content=body,
        headers=[("Content-Type", "application/octet-stream"), ("X-Deadline-Ms", "100"),
                 ("X-Deadline-Ms", "900")],
    )  # fmt: skip
    assert "more than once" in assert_error(twice, 400, "invalid_request")["detail"]
    assert_good(http)
