"""The HTTP contract's model, probes, docs and metrics, in process: /v1/model, /healthz, /readyz,
the OpenAPI schema, the precision reported and run, and /metrics moving with each request."""

from __future__ import annotations

import pytest

from kernels.precision import fused_int8_lanes, int8_kernel
from tests.app.contract_helpers import (
    NUSCENES,
    TIMED,
    WANT_BIN,
    assert_error,
    assert_good,
    frame_bytes,
    limited_serving,
    serving,
)
from tests.app.service_helpers import metric_value
from tests.conftest import require_real_data


@pytest.fixture(scope="module")
def http():
    with limited_serving() as client:
        yield client


def test_model_probes_and_docs(http):
    m = http.get("/v1/model").json()
    assert m["voxel_size"] == 0.05 and m["input_features"] == ["x", "y", "z", "intensity"]
    assert m["licence"] and isinstance(m["training_data"], str)
    assert m["ignore_label"] == 255
    assert len(m["classes"]) == 19 and m["classes"][8] == {
        "id": 8,
        "name": "road",
        "color": [255, 0, 255],
    }
    assert m["engine"]["device"] == "cpu" and "grouping_plan_file" in m["engine"]
    from kernels.precision import cpu_features, resolve, tiles_running

    assert m["engine"]["precision"] == resolve("auto")  # LIDARSEG_PRECISION unset: auto
    assert m["engine"]["precision_requested"] == "auto"
    assert m["engine"]["cpu_features"] == list(cpu_features())
    want_kernel = int8_kernel() if resolve("auto") == "int8" else None
    assert m["engine"]["int8_kernel"] == want_kernel
    assert m["engine"]["amx_tiles"] == tiles_running(resolve("auto"))
    assert m["engine"]["voxelizer"] == "open3d"  # Open3D is a requirement here
    assert m["engine"]["deterministic"] is True  # the CPU adds in plan order (it said false)
    info = http.get("/metrics").text.split("lidarseg_model_info{", 1)[1].split("}", 1)[0]
    assert 'voxelizer="open3d"' in info
    assert http.get("/healthz").status_code == 200
    assert http.get("/readyz").json()["status"] == "ready"
    for probe in ("/healthz", "/readyz"):  # load balancers probe with HEAD (it was a 405)
        assert http.head(probe).status_code == 200
    spec = http.get("/openapi.json").json()
    body = spec["paths"]["/v1/segment"]["post"]["requestBody"]["content"]
    assert {"application/octet-stream", "multipart/form-data", "application/json"} <= set(body)
    ok = spec["paths"]["/v1/segment"]["post"]["responses"]
    assert "application/octet-stream" in ok["200"]["content"]
    # the answer's headers as documented, no more and no fewer (four of eight were listed)
    for accept in ("application/json", "application/octet-stream"):
        r = http.post(
            "/v1/segment?format=nuscenes",
            content=frame_bytes(NUSCENES),
            headers={"Content-Type": "application/octet-stream", "Accept": accept},
        )
        sent = {k.lower() for k in r.headers if k.lower().startswith("x-")}
        assert sent == {k.lower() for k in ok["200"]["headers"]}, accept
    assert {"413", "415", "422", "503", "504"} <= set(ok)
    assert {"/v1/model", "/healthz", "/readyz", "/metrics"} <= set(spec["paths"])
    assert http.get("/docs").status_code == 200


@pytest.mark.skipif(not fused_int8_lanes(), reason="this CPU has no int8 kernel (AVX2)")
def test_a_pinned_precision_is_what_runs_and_what_is_reported():
    """LIDARSEG_PRECISION=int8: /v1/model and /metrics say int8, and frames are segmented."""
    require_real_data()
    with serving(precision="int8") as client:
        engine = client.get("/v1/model").json()["engine"]
        assert engine["precision"] == engine["precision_requested"] == "int8"
        assert engine["int8_kernel"] == int8_kernel()
        info = client.get("/metrics").text.split("lidarseg_model_info{", 1)[1]
        assert 'precision="int8"' in info.split("}", 1)[0]
        r = client.post(
            "/v1/segment?format=nuscenes", content=frame_bytes(NUSCENES), headers=WANT_BIN
        )
        assert r.status_code == 200 and len(r.content) == 34688


def test_deterministic_setting_reaches_the_engine():
    """LIDARSEG_DETERMINISTIC=true: the engine's ordered scatter (what CUDA runs by it); the CPU
    is reported deterministic either way, in /v1/model and lidarseg_model_info."""
    with serving(deterministic=True) as client:
        assert client.app.state.service.pipeline.engine.deterministic is True
        assert client.get("/v1/model").json()["engine"]["deterministic"] is True
        info = client.get("/metrics").text.split("lidarseg_model_info{", 1)[1].split("}", 1)[0]
        assert 'deterministic="true"' in info
    with serving() as client:
        assert client.app.state.service.pipeline.engine.deterministic is False


def test_metrics_move(http):
    before = http.get("/metrics").text
    for name in (
        "lidarseg_stage_duration_seconds_bucket",
        "lidarseg_requests_total",
        "lidarseg_points_per_request",
        "lidarseg_voxels_per_request",
        "lidarseg_queue_depth",
        "lidarseg_batch_size",
        "lidarseg_model_info",
    ):
        assert name in before, name
    from kernels.precision import resolve

    assert f'precision="{resolve("auto")}"' in before.split("lidarseg_model_info{", 1)[1]
    assert_good(http)
    after = http.get("/metrics").text
    ok = 'route="/v1/segment",status="200"'
    for name in ("lidarseg_requests_total", "lidarseg_segment_duration_seconds_count"):
        key = ok if name == "lidarseg_requests_total" else 'status="200"'
        assert metric_value(after, name, key) == metric_value(before, name, key) + 1, name
    assert metric_value(after, "process_resident_memory_bytes") > 0
    for stage in TIMED:
        key = f'stage="{stage}"'
        assert (
            metric_value(after, "lidarseg_stage_duration_seconds_count", key)
            == metric_value(before, "lidarseg_stage_duration_seconds_count", key) + 1
        )
    assert (
        metric_value(after, "lidarseg_points_per_request_sum")
        == metric_value(before, "lidarseg_points_per_request_sum") + 34688
    )


def test_error_answers_are_counted_by_route_and_code_and_carry_the_request_id(http):
    """Every outcome of /v1/segment is timed (the stage histograms see only answered frames);
    error codes are counted (503s of four kinds looked alike); a made-up path is route 'other'
    (bounded labels); error answers carry X-Request-Id too."""
    before = http.get("/metrics").text
    r = http.post("/v1/segment", content=b"", headers={"X-Request-Id": "err-req-7"})
    assert_error(r, 400, "empty_body")
    assert r.headers["x-request-id"] == "err-req-7"
    assert http.get("/v1/no-such-thing/123").status_code == 404
    after = http.get("/metrics").text
    moved = {
        ("lidarseg_errors_total", 'code="empty_body",route="/v1/segment"'): 1,
        ("lidarseg_segment_duration_seconds_count", 'status="400"'): 1,
        ("lidarseg_requests_total", 'route="other",status="404"'): 1,
        ("lidarseg_errors_total", 'code="not_found",route="other"'): 1,
    }
    for (name, key), step in moved.items():
        assert metric_value(after, name, key) == metric_value(before, name, key) + step, key
    assert "/v1/no-such-thing" not in after
