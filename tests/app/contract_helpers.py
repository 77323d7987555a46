"""In-process apps for the HTTP contract tests: the real app (create_app, its lifespan, model
load, worker) behind Starlette's TestClient, with the small random model (cr 0.25)."""

from __future__ import annotations

import contextlib
import time

import numpy as np
from fastapi.testclient import TestClient

from app.inference.pipeline import STAGES
from app.service.config import Settings
from app.service.main import create_app
from tests.conftest import load_frame, require_real_data

KITTI = "semantickitti/seq00_000000.bin"
NUSCENES = "nuscenes/n015-2018-07-24-11-22-45+0800__LIDAR_TOP__1532402927647951.pcd.bin"
OUSTER = "ouster/os1-128_lb_n3_scan0_xyzr.bin"  # x, y, z, intensity 0..255
BIN = {"Content-Type": "application/octet-stream"}
WANT_BIN = {**BIN, "Accept": "application/octet-stream"}
TIMED = {*STAGES, "total"}  # the stages every response times


@contextlib.contextmanager
def serving(**settings):
    """A TestClient of a ready app (the lifespan runs: model loaded and warmed, worker up)."""
    app = create_app(
        Settings(
            **{
                "weights": "random",
                "cr": 0.25,
                "device": "cpu",
                "log_level": "warning",
                "access_log": "off",
                **settings,
            }
        )
    )
    with TestClient(app, raise_server_exceptions=False) as client:
        end = time.monotonic() + 120
        while client.get("/readyz").status_code != 200:
            assert time.monotonic() < end, client.get("/readyz").json()
            time.sleep(0.02)
        yield client


def frame_bytes(name: str) -> bytes:
    return np.ascontiguousarray(load_frame(name)).tobytes()


def assert_error(r, status: int, code: str | None = None) -> dict:
    """A JSON error body {"error": code, "detail": text} with this status."""
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert set(body) == {"error", "detail"} and body["detail"], body
    if code:
        assert body["error"] == code, body
    return body


@contextlib.contextmanager
def limited_serving():
    """A ready app (serving) with a 4 MiB body limit and 150 000 points at most."""
    require_real_data()
    with serving(max_body_bytes=4 * 1024 * 1024, max_points=150_000) as client:
        yield client


def assert_good(http) -> None:
    """A good request right after an error still succeeds."""
    r = http.post("/v1/segment?format=nuscenes", content=frame_bytes(NUSCENES), headers=WANT_BIN)
    assert r.status_code == 200 and len(r.content) == 34688
