"""An in-process app (the real lifespan, model load and worker) for the observability tests."""

from __future__ import annotations

import contextlib
import io
import time

from fastapi.testclient import TestClient

from app.service.access_log import AccessLog
from app.service.config import Settings
from app.service.main import create_app
from app.service.tracing import Tracing
from tests.conftest import REAL_DATA

SMALL_KITTI = REAL_DATA / "semantickitti" / "seq00_000000_subset50.bin"
PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"


@contextlib.contextmanager
def app_client(tracing: Tracing | None = None, access_log: str = "json", **settings):
    """(TestClient, app, the access log's stream) of a ready app with the small random model."""
    app = create_app(Settings(weights="random", cr=0.25, device="cpu", **settings))
    obs = app.state.observe
    if tracing is not None:
        obs.tracing = tracing
    stream = io.StringIO()
    obs.access_log = AccessLog(access_log, stream=stream)
    with TestClient(app, raise_server_exceptions=False) as client:
        end = time.monotonic() + 120
        while client.get("/readyz").status_code != 200:
            assert time.monotonic() < end, "app not ready within 120 s"
            time.sleep(0.05)
        yield client, app, stream


def small_frame() -> bytes:
    return SMALL_KITTI.read_bytes()
