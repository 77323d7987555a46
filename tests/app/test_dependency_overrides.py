"""The routes' contracts with their state swapped through app.dependency_overrides (the
full-stack-fastapi-template's way to fast in-process tests): create_app builds the app, its
lifespan never runs (the TestClient is never entered: no model load, no warm-up), and get_service
answers a ServiceState around a stand-in pipeline and a real InferenceWorker. The app's own
ServiceState (default Settings: no API key, a 64 MiB body limit) stays not ready, so every answer
below can only come from the override.

No override reaches the middlewares or the lifespan (they hold the ServiceState create_app made):
the /docs key gate, the request counts and the drain's 503 for a cancelled request are tested
with the real app (test_contract_*.py, test_errors.py)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.inference.pipeline import FrameResult
from app.inference.voxel_config import VoxelizeConfig
from app.service.config import Settings
from app.service.main import create_app
from app.service.routes.deps import get_service, get_settings
from app.service.state import ServiceState
from app.service.worker import InferenceWorker
from tests.app.contract_helpers import assert_error
from tests.app.inproc_helpers import ready_service
from tests.app.worker_helpers import FakePipeline

KEY = "override-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
BODY_LIMIT = 64 * 1024  # the stand-in's max_body_bytes (the app's own: 64 MiB)
CLASSES = ["road", "car", "tree"]
SEGMENT = "/v1/segment?format=kitti"


class StandInPipeline(FakePipeline):
    """FakePipeline (it records each frame's first value) answering FrameResults: label i % 3
    for point i, one voxel per point."""

    voxel_config = VoxelizeConfig()
    precision = requested_precision = "fp32"
    deterministic = True

    def run(self, frames, sensors, layer_timing=False, **_):
        super().run(frames, sensors, layer_timing)
        return [
            FrameResult(
                labels=(np.arange(len(f)) % len(CLASSES)).astype(np.uint8),
                num_points=len(f),
                num_voxels=len(f),
                ignored={},
                timing_ms={},
            )
            for f in frames
        ]


def stand_in_service() -> ServiceState:
    """A ready ServiceState, an API key and a 64 KiB body limit in its settings."""
    service = ready_service(api_keys=(KEY,), max_body_bytes=BODY_LIMIT, max_bodies_bytes=1 << 20)
    service.pipeline = StandInPipeline(ms_per_point=0.0)
    service.worker = InferenceWorker(service.pipeline, service.settings.queue_size)
    service.model_name, service.model_version = "stand-in", "7"
    service.class_names = CLASSES
    service.class_colors = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    service.voxel_size, service.input_features = 0.25, ["x", "y", "z", "intensity"]
    return service


@pytest.fixture
def stand_in():
    service = stand_in_service()
    yield service
    service.worker.stop(5)


@pytest.fixture
def app():
    app = create_app(Settings(weights="random", device="cpu", access_log="off"))
    yield app
    assert app.state.service.worker is None  # the lifespan never ran: no model was loaded


@pytest.fixture
def client(app, stand_in):
    app.dependency_overrides[get_service] = lambda: stand_in
    return TestClient(app, raise_server_exceptions=False)  # not entered: no lifespan


def points(n: int, tag: float = 5.0) -> bytes:
    """n KITTI records in range; the first x is `tag` (the stand-in records it)."""
    pts = np.full((n, 4), 0.5, np.float32)
    pts[0, 0] = tag
    return pts.tobytes()


def call(client: TestClient, path: str, headers: dict):
    """POST ten points to /v1/segment, GET any other path."""
    if path == SEGMENT:
        return client.post(path, content=points(10), headers=headers)
    return client.get(path, headers=headers)


def test_segment_answers_the_stand_ins_labels(client, stand_in):
    r = client.post(SEGMENT, content=points(1000), headers=AUTH)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["labels"] == [i % 3 for i in range(1000)]
    assert body["num_points"] == 1000 and body["classes"] == CLASSES
    assert body["model"]["name"] == "stand-in" and r.headers["X-Model"] == "stand-in:7"
    assert stand_in.pipeline.ran == [5]


def test_binary_labels_have_one_byte_per_point(client):
    headers = {**AUTH, "Accept": "application/octet-stream"}
    r = client.post(SEGMENT, content=points(333), headers=headers)
    assert r.status_code == 200, r.text
    assert list(r.content) == [i % 3 for i in range(333)]


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}], ids=["none", "wrong"])
@pytest.mark.parametrize("path", [SEGMENT, "/v1/model"])
def test_the_overridden_key_is_required(client, stand_in, path, headers):
    r = call(client, path, headers)
    assert_error(r, 401, "unauthorized")
    assert r.headers["WWW-Authenticate"] == "Bearer"
    assert stand_in.pipeline.ran == []


def test_a_body_over_the_overridden_limit_is_413(client, stand_in):
    r = client.post(SEGMENT, content=points(BODY_LIMIT // 16 + 1), headers=AUTH)
    assert_error(r, 413, "body_too_large")
    assert stand_in.pipeline.ran == []


def test_a_body_at_the_overridden_limit_is_segmented(client):
    r = client.post(SEGMENT, content=points(BODY_LIMIT // 16), headers=AUTH)
    assert r.status_code == 200 and r.json()["num_points"] == BODY_LIMIT // 16


@pytest.mark.parametrize("path", [SEGMENT, "/v1/model"])
def test_a_stand_in_not_ready_is_503(client, stand_in, path):
    stand_in.ready, stand_in.load_error = False, "OSError: no weights"  # the app's: "loading"
    r = call(client, path, AUTH)
    assert "failed to load" in assert_error(r, 503, "not_ready")["detail"]
    assert r.headers["Retry-After"] == "1"


def test_a_draining_stand_in_refuses_frames(client, stand_in):
    stand_in.begin_drain(time.monotonic() + 5)
    r = client.post(SEGMENT, content=points(10), headers=AUTH)
    assert_error(r, 503, "draining")
    assert stand_in.pipeline.ran == []


def test_model_reports_the_stand_in(client):
    r = client.get("/v1/model", headers=AUTH)
    assert r.status_code == 200, r.text
    info = r.json()
    assert (info["name"], info["version"], info["ready"]) == ("stand-in", "7", True)
    assert [c["name"] for c in info["classes"]] == CLASSES
    assert info["classes"][2] == {"id": 2, "name": "tree", "color": [7, 8, 9]}
    assert info["voxel_size"] == 0.25 and info["input_features"] == ["x", "y", "z", "intensity"]
    assert info["engine"]["precision"] == "fp32" and info["engine"]["deterministic"] is True


def readyz(client) -> tuple[int, str]:
    r = client.get("/readyz")
    return r.status_code, r.json()["status"]


def test_readyz_follows_the_stand_in(client, stand_in):
    assert readyz(client) == (200, "ready")
    assert client.get("/readyz").json()["model"] == "stand-in:7"
    stand_in.ready = False
    assert readyz(client) == (503, "starting")
    stand_in.ready = True
    stand_in.worker.stop(5)
    assert readyz(client) == (503, "worker_dead")
    stand_in.begin_drain(time.monotonic() + 5)
    assert readyz(client) == (503, "draining")


def test_without_the_override_the_apps_own_state_answers(app):
    """The app's own ServiceState (the lifespan never ran) is not ready: what the tests above
    see comes from the override."""
    client = TestClient(app, raise_server_exceptions=False)
    assert readyz(client) == (503, "starting")
    assert_error(client.get("/v1/model"), 503, "not_ready")


def test_a_get_settings_override_alone_reaches_the_dashboard_key_only(app):
    """get_settings follows get_service; overridden alone it reaches SettingsDep's dependants
    (the dashboard's key check) and not /v1's, which reads the service's settings (deps.py)."""
    app.dependency_overrides[get_settings] = lambda: Settings(weights="random", api_keys=(KEY,))
    client = TestClient(app, raise_server_exceptions=False)
    assert_error(client.get("/v1/requests"), 401, "unauthorized")
    assert client.get("/v1/requests", headers=AUTH).status_code == 200
    assert_error(client.get("/v1/model"), 503, "not_ready")  # no 401: the app's own settings
