"""Errors that must not leak: fixed messages for 500s and unexpected decode failures (details only
in the log, with the request id), no server paths, /docs and /openapi.json behind the key; and
values that must be accepted: intensity clamped to the sensor's range, huge JSON integers. The
app runs in process (httpx's ASGI transport) with its state set by hand: no model is loaded."""

from __future__ import annotations

import asyncio
import concurrent.futures
import io
import logging
from types import SimpleNamespace

import httpx
import numpy as np
import pytest

from app.codecs import decode
from app.inference.voxel_config import VoxelizeConfig
from app.service.config import Settings
from app.service.main import create_app
from app.inference import cleaning
from app.service.routes import decoding
from tests.conftest import REPO_ROOT

KEY = "errors-key-0123456789"
SECRET = f"{REPO_ROOT}/secret 0x7f00deadbeef"


class Exploding:
    """A worker whose submit fails with a message that must not reach the client."""

    depth, alive, idle = 0, True, True

    def submit(self, *args, **kwargs):
        raise RuntimeError(SECRET)


class Pipeline:
    voxel_config = VoxelizeConfig()
    precision = requested_precision = "fp32"


def _app(**settings):
    app = create_app(Settings(weights="random", **settings))
    service = app.state.service
    service.ready, service.worker, service.pipeline = True, Exploding(), Pipeline()
    service.decoder = concurrent.futures.ThreadPoolExecutor(2)
    service.model_name, service.model_version = "m", "v"
    return app


def _call(app, method: str, path: str, **kwargs) -> httpx.Response:
    async def go():
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            return await c.request(method, path, **kwargs)

    return asyncio.run(go())


def test_500_has_a_fixed_message_and_the_log_has_the_details(caplog):
    app = _app()
    body = np.zeros((100, 4), np.float32).tobytes()
    with caplog.at_level(logging.ERROR):
        r = _call(
            app,
            "POST",
            "/v1/segment?format=kitti",
            content=body,
            headers={"X-Request-Id": "req-42"},
        )
    assert r.status_code == 500
    assert r.json() == {"error": "internal_error", "detail": "internal error (request id req-42)"}
    assert SECRET not in r.text and "0x7f" not in r.text
    assert "req-42" in caplog.text and SECRET in caplog.text


def test_unexpected_decode_failure_is_a_fixed_400(monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise KeyError(SECRET)

    monkeypatch.setattr(decoding, "decode", broken)
    with caplog.at_level(logging.ERROR):
        r = _call(
            _app(),
            "POST",
            "/v1/segment?format=kitti",
            content=b"\0" * 16,
            headers={"X-Request-Id": "req-7"},
        )
    assert r.status_code == 400 and r.json()["error"] == "malformed_body"
    assert "req-7" in r.json()["detail"] and str(REPO_ROOT) not in r.text
    assert SECRET in caplog.text


def test_docs_behind_the_key_unless_opened():
    closed = _app(api_keys=KEY)
    for path in ("/openapi.json", "/docs"):
        r = _call(closed, "GET", path, headers={"X-Request-Id": "docs-1"})
        assert r.status_code == 401 and r.headers["connection"] == "close", path
        assert r.headers["x-request-id"] == "docs-1"  # every answer carries its id
        assert (
            _call(closed, "GET", path, headers={"Authorization": f"Bearer {KEY}"}).status_code
            == 200
        )
    opened = _app(api_keys=KEY, open_docs=True)
    assert _call(opened, "GET", "/openapi.json").status_code == 200
    assert _call(_app(), "GET", "/openapi.json").json()["paths"]["/v1/segment"]


def test_model_description_has_no_server_path():
    from app.service.main import load_service

    app = create_app(Settings(weights="random", cr=0.25, device="cpu"))
    load_service(app.state.service)
    r = _call(app, "GET", "/v1/model")
    assert r.status_code == 200
    assert str(REPO_ROOT) not in r.text and "/" not in str(r.json()["engine"]["grouping_plan_file"])
    app.state.service.worker.stop(30)


@pytest.mark.parametrize("sensor,top", [("kitti", 1.0), ("nuscenes", 255.0)])
@pytest.mark.parametrize("columns", [4, 5])
def test_the_route_cleans_exactly_the_frames_that_need_it(sensor, top, columns):
    """The validity pass counts the rows to clean; a clean frame is passed on as it came."""
    service = SimpleNamespace(
        settings=Settings(), pipeline=SimpleNamespace(voxel_config=VoxelizeConfig())
    )
    pts = np.random.default_rng(0).uniform(0, top, (1000, columns)).astype(np.float32)
    pts[:, 3] = np.linspace(0, top, len(pts), dtype=np.float32)  # both ends included
    checked, _, cleaned = decoding.check_points(service, pts, sensor)
    assert checked is pts and cleaned == 0
    bads = [(3, -1e-30), (3, np.nextafter(np.float32(top), np.float32(np.inf))), (3, np.nan)]
    bads += [(4, np.inf), (4, np.nan)] if columns == 5 else []
    for column, bad in bads:
        dirty = pts.copy()
        dirty[17, column] = bad
        out, _, cleaned = decoding.check_points(service, dirty, sensor)
        assert out is not dirty and cleaned == 1
        np.testing.assert_array_equal(out, cleaning.clean_extra_columns(dirty, np.float32(top)))
        assert np.isfinite(out).all() and out[:, 3].min() >= 0 and out[:, 3].max() <= top


@pytest.mark.parametrize("sensor,top", [("kitti", 1.0), ("nuscenes", 255.0), ("ouster", 255.0)])
def test_intensity_clamped_to_the_sensor_range(sensor, top):
    pts = np.zeros((5, 5), np.float32)
    pts[:, 3] = [-7.0, 0.5, 3e38, np.nan, np.inf]
    pts[:, 4] = [1, 2, 3, np.nan, 5]
    out = cleaning.clean_extra_columns(pts, np.float32(top))
    np.testing.assert_array_equal(out[:, 3], [0.0, min(0.5, top), top, 0.0, 0.0])  # inf: 0
    np.testing.assert_array_equal(out[:, 4], [1, 2, 3, 0, 5])
    assert np.isinf(pts[4, 3])  # the caller's array is not changed
    ok = np.ones((3, 4), np.float32)
    assert cleaning.clean_extra_columns(ok, np.float32(top)) is ok
    assert cleaning.clean_extra_columns(ok[:0], np.float32(top)).shape == (0, 4)
    for bad in (np.nan, -np.inf, -1e-30):  # the intensity alone, then a later column alone
        one = np.ones((3, 4), np.float32)
        one[1, 3] = bad
        assert cleaning.clean_extra_columns(one, np.float32(top))[1, 3] == 0.0
        two = np.ones((3, 5), np.float32)
        two[2, 4] = bad
        assert cleaning.clean_extra_columns(two, np.float32(top))[2, 4] == (bad if bad > -1 else 0)


def test_large_json_integers_are_numbers():
    body = b'{"points": [[100000000000000000000000, 2, 3, 1], [1e30, -99999999999999999999, 0, 0]]}'
    frame = decode(body, "json")
    assert (
        frame.points.tolist()
        == np.array([[1e23, 2, 3, 1], [1e30, -1e20, 0, 0]], np.float32).tolist()
    )
    slow = body.replace(b'"points"', b'"meta": 1, "points"')  # the json-module path
    assert decode(slow, "json").points.tolist() == frame.points.tolist()


def test_small_raw_bodies_decode_inline_and_the_rest_on_the_pool(monkeypatch):
    """A raw float32 body (kitti, ouster, nuscenes, xyz by format or content type) of at most
    INLINE_DECODE_BYTES skips the decode pool; bigger ones and other formats take it."""
    limit = decoding.INLINE_DECODE_BYTES
    assert decoding.decodes_inline("kitti", None, limit)
    assert decoding.decodes_inline(" XYZ ", "text/plain", 12)
    assert decoding.decodes_inline(None, "application/x-nuscenes; v=1", 20)
    assert decoding.decodes_inline("ouster", None, 16)
    assert not decoding.decodes_inline("kitti", None, limit + 1)
    assert not decoding.decodes_inline("pcd", None, 100)
    assert not decoding.decodes_inline(None, "application/octet-stream", 100)
    pooled = []
    real = decoding.decode_in_pool

    async def counting(service, posted):
        pooled.append(posted.fmt)
        return await real(service, posted)

    monkeypatch.setattr(decoding, "decode_in_pool", counting)
    app = _app(api_keys=KEY)
    auth = {"Authorization": f"Bearer {KEY}"}
    body = np.zeros((10, 4), np.float32).tobytes()
    for fmt in ("kitti", "npy"):
        data = body if fmt == "kitti" else _npy(np.zeros((10, 4), np.float32))
        r = _call(app, "POST", f"/v1/segment?format={fmt}", content=data, headers=auth)
        assert r.status_code == 500 and r.json()["error"] == "internal_error"  # then submit
    assert pooled == ["npy"]
    service = app.state.service
    service.decoding = service.settings.decode_slots  # every decode slot taken (a text flood)
    raw = _call(app, "POST", "/v1/segment?format=kitti", content=body, headers=auth)
    assert raw.json()["error"] == "internal_error"  # needs no slot: admitted, as before
    npy = _call(
        app, "POST", "/v1/segment?format=npy", content=_npy(np.zeros((10, 4))), headers=auth
    )
    assert npy.status_code == 503 and npy.json()["error"] == "decoders_busy"


def _npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


@pytest.mark.parametrize("draining", [True, False])
def test_a_request_cancelled_by_the_shutdown_gets_a_json_503(draining):
    """uvicorn cancels the requests that outlast the drain: a JSON 503 `draining` (it answered
    a text/plain 500 and logged a traceback); a cancel outside a drain still propagates."""
    from app.service.accounting import RequestAccounting
    from app.service.state import ServiceState

    service = ServiceState(Settings(weights="random", device="cpu"), draining=draining)
    sent: list[dict] = []

    async def endless(scope, receive, send):
        await asyncio.Event().wait()

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    async def run() -> bool:
        scope = {"type": "http", "path": "/v1/segment", "headers": [], "method": "POST"}
        task = asyncio.ensure_future(RequestAccounting(endless, service)(scope, receive, send))
        await asyncio.sleep(0.01)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return False
        return True

    ended_normally = asyncio.run(run())
    assert ended_normally is draining
    assert service.in_flight == 0
    if draining:
        start, body = sent[0], sent[1]
        assert start["status"] == 503 and (b"connection", b"close") in start["headers"]
        assert b'"error":"draining"' in body["body"]
    else:
        assert sent == []
