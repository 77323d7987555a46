"""OTLP/HTTP export, switched on by the standard OTEL_* variables only, reaches a small receiver
started here (decoded with the OTLP protobuf definitions)."""

from __future__ import annotations

import http.server
import threading
import time

import httpx
import numpy as np
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.app.observe_helpers import PARENT
from tests.app.service_helpers import Server
from tests.conftest import load_frame, require_real_data
from app.inference.pipeline import STAGES


class Receiver(http.server.ThreadingHTTPServer):
    """Answers POST /v1/traces with 200 and keeps every span it was sent."""

    def __init__(self):
        self.spans, self.paths = [], []
        self.lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportTraceServiceRequest.FromString(body)
                with receiver.lock:
                    receiver.paths.append(self.path)
                    for rs in request.resource_spans:
                        service = {a.key: a.value.string_value for a in rs.resource.attributes}
                        for ss in rs.scope_spans:
                            receiver.spans += [(service, s) for s in ss.spans]
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)


def test_otlp_http_export_reaches_a_receiver(monkeypatch):
    require_real_data()
    receiver = Receiver()
    thread = threading.Thread(target=receiver.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv(
        "OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{receiver.server_address[1]}"
    )
    monkeypatch.setenv("OTEL_SERVICE_NAME", "lidarseg-test")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    srv = Server()
    try:
        points = np.ascontiguousarray(load_frame("semantickitti/seq00_000000_subset50.bin"))
        r = httpx.post(
            f"{srv.url}/v1/segment?format=kitti",
            content=points.tobytes(),
            headers={"traceparent": PARENT},
            timeout=120,
        )
        assert r.status_code == 200, r.text
        trace_id = bytes.fromhex(PARENT.split("-")[1])
        end = time.monotonic() + 60
        while time.monotonic() < end:
            with receiver.lock:
                names = {s.name for _, s in receiver.spans if s.trace_id == trace_id}
            if set(STAGES) <= names and "POST /v1/segment" in names:
                break
            time.sleep(0.1)
        assert {*STAGES, "POST /v1/segment", "inference"} <= names, names
        with receiver.lock:
            root = next(s for _, s in receiver.spans if s.name == "POST /v1/segment")
            service = next(svc for svc, s in receiver.spans if s is root)
        assert root.parent_span_id == bytes.fromhex(PARENT.split("-")[2])
        assert service["service.name"] == "lidarseg-test"
        assert set(receiver.paths) == {"/v1/traces"}
    finally:
        assert srv.stop() == 0, srv.output()
        receiver.shutdown()
        receiver.server_close()
