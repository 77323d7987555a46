"""Traces, exemplars, the access log and the request ring, on the in-process app (real model load,
worker and routes), with the OpenTelemetry SDK's in-memory exporter."""

from __future__ import annotations

import base64
import concurrent.futures
import io
import json
import re
import time

import numpy as np
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from app.service.access_log import AccessLog
from app.service.recent import RequestRing
from app.service.tracing import Tracing, export_requested
from tests.app.observe_helpers import OPENMETRICS, PARENT, app_client, small_frame
from tests.conftest import load_frame, require_real_data
from app.inference.pipeline import STAGES

KEY = "observe-key-0123456789"


@pytest.fixture(scope="module")
def traced():
    require_real_data()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with app_client(Tracing(provider), max_batch=2, deadline_s=300) as (client, app, log):
        yield client, exporter, log


def post(client, headers=None, accept="application/json"):
    return client.post(
        "/v1/segment?format=kitti",
        content=small_frame(),
        headers={"Content-Type": "application/octet-stream", "Accept": accept, **(headers or {})},
    )


def spans_of(exporter, trace_id: str) -> list:
    return [s for s in exporter.get_finished_spans() if f"{s.context.trace_id:032x}" == trace_id]


def test_span_tree_and_stage_durations(traced):
    client, exporter, _ = traced
    r = post(client, {"traceparent": PARENT})
    assert r.status_code == 200, r.text
    body = r.json()
    version, trace_id, span_id, flags = r.headers["traceparent"].split("-")
    assert trace_id == PARENT.split("-")[1] and flags == "01"  # the caller's trace goes on
    spans = spans_of(exporter, trace_id)
    root = next(s for s in spans if s.name == "POST /v1/segment")
    assert f"{root.context.span_id:016x}" == span_id  # the span the header names
    assert f"{root.parent.span_id:016x}" == PARENT.split("-")[2]  # child of the caller's span
    children = {s.name: s for s in spans if s.parent and s.parent.span_id == root.context.span_id}
    assert set(children) == {*STAGES, "inference"}, sorted(children)
    for stage in STAGES:
        ms = (children[stage].end_time - children[stage].start_time) / 1e6
        assert ms == pytest.approx(body["timing_ms"][stage], abs=2e-3), stage
    inference = children["inference"]
    for stage in ("voxelize", "maps", "network", "devoxelize"):  # linked to the shared run
        assert [link.context.span_id for link in children[stage].links] == [
            inference.context.span_id
        ]
    attrs = root.attributes
    assert attrs["lidarseg.points"] == body["num_points"]
    assert attrs["lidarseg.voxels"] == body["num_voxels"]
    assert attrs["lidarseg.ignored_points"] == body["ignored_points"]
    assert attrs["lidarseg.cleaned_points"] == body["cleaned_points"]
    assert attrs["lidarseg.batch_size"] == body["batch_size"] == 1
    assert attrs["lidarseg.format"] == "kitti"
    assert attrs["lidarseg.device"] == "cpu" and attrs["lidarseg.model"].startswith("minkunet")
    assert attrs["http.response.status_code"] == 200
    assert attrs["lidarseg.request_id"] == body["request_id"]


def test_batched_frames_link_to_one_inference_span(traced):
    """Two frames queued behind a long one run as one batch: one `inference` span, which both
    frames' pipeline-stage spans link to."""
    client, exporter, _ = traced
    big = np.ascontiguousarray(load_frame("semantickitti/seq00_000000.bin")).tobytes()
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        first = pool.submit(client.post, "/v1/segment?format=kitti", content=big)
        time.sleep(0.5)  # the big frame occupies the worker ...
        responses = list(pool.map(lambda _: post(client), range(2)))  # ... these two queue
        assert first.result().status_code == 200, first.result().text
    assert all(r.status_code == 200 for r in responses)
    if {r.json()["batch_size"] for r in responses} != {2}:
        pytest.skip("the two frames did not meet in one batch (the big frame ended first)")
    traces = [r.headers["traceparent"].split("-")[1] for r in responses]
    linked = [
        {lk.context.span_id for s in spans_of(exporter, t) if s.name == "network" for lk in s.links}
        for t in traces
    ]
    assert len(linked[0]) == 1 and linked[0] == linked[1]  # both frames: the same run
    runs = [s for t in traces for s in spans_of(exporter, t) if s.name == "inference"]
    assert len(runs) == 1 and runs[0].attributes["lidarseg.batch_size"] == 2
    assert len(runs[0].links) == 1  # ... linked to the other request


def test_error_status_is_on_the_span(traced):
    client, exporter, _ = traced
    r = client.post("/v1/segment?format=nope", content=b"x" * 16)
    assert r.status_code == 415
    trace_id = r.headers["traceparent"].split("-")[1]
    (root,) = [s for s in spans_of(exporter, trace_id) if s.name.startswith("POST")]
    assert root.attributes["http.response.status_code"] == 415
    made_up = client.get("/wp-admin/93417").headers["traceparent"].split("-")[1]
    (span,) = [s for s in spans_of(exporter, made_up) if not s.parent]
    assert span.name == "GET"  # a client's path never names a span (bounded names)
    for path in ("/healthz", "/readyz", "/metrics"):  # probes and scrapes make no spans
        probe = client.get(path).headers["traceparent"].split("-")[1]
        assert spans_of(exporter, probe) == []
    listed = client.get("/v1/requests").json()["requests"]
    entry = next(e for e in listed if e["trace_id"] == trace_id)  # failures are listed too
    assert entry["status"] == 415 and not entry["has_points"] and "total" in entry["timing_ms"]


def test_openmetrics_scrape_has_exemplars(traced):
    client, _, _ = traced
    trace_id = post(client).headers["traceparent"].split("-")[1]
    r = client.get("/metrics", headers={"Accept": OPENMETRICS})
    assert r.headers["content-type"].startswith("application/openmetrics-text")
    assert r.text.rstrip().endswith("# EOF")
    found = re.findall(
        r'^lidarseg_stage_duration_seconds_bucket\{[^}]*stage="(\w+)"\} \S+ '
        r'# \{trace_id="([0-9a-f]{32})"\}',
        r.text,
        re.M,
    )
    assert {s for s, t in found if t == trace_id} >= {*STAGES, "total"}
    # a trace the sampler left out (its caller's flags 00: ParentBased) is in no backend: its
    # exemplar would be a dead link
    unsampled = f"00-{'5e' * 16}-{'a1' * 8}-00"
    left_out = post(client, {"traceparent": unsampled}).headers["traceparent"].split("-")[1]
    scrape = client.get("/metrics", headers={"Accept": OPENMETRICS}).text
    assert left_out == "5e" * 16 and left_out not in scrape
    plain = client.get("/metrics")  # the classic format: none
    assert plain.headers["content-type"].startswith("text/plain") and "# {" not in plain.text


def test_access_log_json_line(traced):
    client, _, log = traced
    log.seek(0)
    log.truncate()
    r = post(client, {"X-Request-Id": "log-check-1"}, accept="application/octet-stream")
    client.get("/healthz")  # quiet: not logged
    lines = [json.loads(x) for x in log.getvalue().splitlines()]
    assert len(lines) == 1, lines
    entry = lines[0]
    timing = dict(p.split(";dur=") for p in r.headers["server-timing"].split(", "))
    assert entry["request_id"] == "log-check-1" and entry["status"] == 200
    assert entry["trace_id"] == r.headers["traceparent"].split("-")[1]
    assert entry["points"] == int(r.headers["x-num-points"])
    assert entry["voxels"] == int(r.headers["x-num-voxels"])
    assert entry["batch_size"] == 1 and entry["format"] == "kitti"
    assert entry["path"] == "/v1/segment" and entry["client"].startswith("testclient")
    assert set(entry["stages_ms"]) == {*STAGES, "total"}
    for k, v in entry["stages_ms"].items():
        assert v == pytest.approx(float(timing[k]), abs=1e-3), k


def test_access_log_text_and_no_secrets():
    stream = io.StringIO()
    log = AccessLog("text", stream=stream)
    log.write("POST", "/v1/segment", 401, "10.0.0.1:5", "rid", "ab" * 16, {"total": 1.25}, {})
    line = stream.getvalue()
    assert line.startswith("20") and '"POST /v1/segment" 401 rid=rid' in line
    assert "total=1.2" in line and "10.0.0.1:5" in line
    forged = '/v1/x\n2026-12-06T00:00:00Z 10.0.0.9 "GET /v1/model" 200'  # a decoded %0a
    log.write("GET", forged, 404, None, "r2", "ab" * 16, {}, {"error": "not_found"})
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and "error=not_found" in lines[1]
    assert AccessLog("auto", stream=io.StringIO()).mode == "json"  # not a terminal

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    assert AccessLog("auto", stream=Terminal()).mode == "text"


@pytest.mark.parametrize("mode", ["auto", "json", "text", "off"])
def test_access_log_off_means_none_and_uvicorns_is_never_on(mode):
    """LIDARSEG_ACCESS_LOG=off once turned uvicorn's own access log on (a logging record per
    request, about 0.1 ms of the event loop's time at 10 Hz): off is none, and uvicorn's log is
    off with every mode (ours writes one line where a mode asks for it)."""
    from app.service.config import Settings
    from app.service.server import uvicorn_config

    assert uvicorn_config(lambda *a: None, Settings(access_log=mode)).access_log is False
    assert AccessLog(mode, stream=io.StringIO()).enabled == (mode != "off")


def test_keys_guard_dashboard_and_its_json():
    require_real_data()
    with app_client(api_keys=KEY) as (client, _, log):
        bearer = {"Authorization": f"Bearer {KEY}"}
        basic = {"Authorization": "Basic " + base64.b64encode(f"me:{KEY}".encode()).decode()}
        for path in ("/dashboard", "/v1/requests", "/v1/requests/x"):
            r = client.get(path)
            assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Basic")
        assert client.get("/dashboard", headers=basic).status_code == 200
        assert client.get("/v1/requests", headers=bearer).status_code == 200
        r = post(client, bearer)
        assert r.status_code == 200
        assert post(client, basic).status_code == 200  # the page's drop, with Basic
        assert (
            KEY not in log.getvalue()
            and base64.b64encode(KEY.encode()).decode()[:12] not in log.getvalue()
        )


def test_ring_keeps_points_within_budget():
    require_real_data()
    with app_client(dashboard_requests=3, dashboard_points_mb=0.001) as (client, _, _):
        ids = [post(client, {"X-Request-Id": f"r{i}"}).json() for i in range(4)]
        listing = client.get("/v1/requests").json()
        assert [r["id"] for r in listing["requests"]] == ["r3", "r2", "r1"]  # newest first
        last = ids[-1]
        got = client.get("/v1/requests/r3/points")
        n = int(got.headers["x-num-points"])
        assert n == last["num_points"] and len(got.content) == 13 * n
        labels = np.frombuffer(got.content[12 * n :], np.uint8)
        assert labels.tolist() == last["labels"]
        detail = client.get("/v1/requests/r3").json()
        assert detail["class_counts"] == last["class_counts"]
        assert set(detail["timing_ms"]) == {*STAGES, "total"}
        # 50 points x 17 B: one frame fits in 0.001 MB (1048 B), the older ones were let go
        old = client.get("/v1/requests/r2").json()
        assert not old["has_points"] and old["class_counts"] is None
        assert old["points"] == ids[2]["num_points"]
        assert client.get("/v1/requests/r2/points").status_code == 404
        assert client.get("/v1/requests/r0").status_code == 404


def test_ring_off_and_points_off():
    ring = RequestRing(0, 1 << 20)
    ring.add(
        {"id": "a", "status": 200, "time": 0, "timing_ms": {}},
        np.zeros((4, 4)),
        np.zeros(4, np.uint8),
    )
    assert ring.listing() == []
    ring = RequestRing(4, 0)
    ring.add(
        {"id": "a", "status": 200, "time": 0, "timing_ms": {}},
        np.zeros((4, 4)),
        np.zeros(4, np.uint8),
    )
    assert ring.get("a").points is None and ring.kept_bytes == 0


def test_docs_served_without_a_cdn(traced):
    client, _, _ = traced
    html = client.get("/docs").text
    urls = re.findall(r'(?:src|href)="([^"]+)"', html) + re.findall(r"url: '([^']+)'", html)
    assert urls and all(u.startswith("/") for u in urls), urls
    for u in urls:
        assert client.get(u).status_code == 200, u


def test_tracing_is_off_without_otel_variables():
    assert export_requested({}) is None
    assert export_requested({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318"}) == "otlp"
    assert (
        export_requested(
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318", "OTEL_SDK_DISABLED": "true"}
        )
        is None
    )
    assert export_requested({"OTEL_TRACES_EXPORTER": "none"}) is None
    with pytest.raises(ValueError):
        export_requested({"OTEL_TRACES_EXPORTER": "zipkin"})
    off = Tracing(None)
    rt = off.start("GET /", PARENT, {})
    assert rt.trace_id == PARENT.split("-")[1] and rt.span is None and rt.sampled
    assert Tracing(None).start("GET /", "garbage", {}).trace_id != rt.trace_id
