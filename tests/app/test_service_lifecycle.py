"""The service process's start and stop: `python -m app serve` in a subprocess (LIDARSEG_CR=0.25
for speed) drains the requests in flight on SIGTERM and exits 0, refuses bad settings at start
with status 2, and stops with status 3 when its model fails to load, saying why in JSON log
lines."""

from __future__ import annotations

import json
import signal
import threading
import time

import numpy as np

from tests.conftest import load_frame, require_real_data

from tests.app.contract_helpers import BIN, KITTI, WANT_BIN, assert_error, frame_bytes
from tests.app.service_helpers import Server, metric_value


def test_sigterm_drains_in_flight_then_exits_0():
    require_real_data()
    srv = Server()
    body = np.concatenate([np.array(load_frame(KITTI))] * 2).tobytes()
    result: dict = {}

    def post():
        with srv.client() as c:
            result["r"] = c.post("/v1/segment?format=kitti", content=body, headers=WANT_BIN)

    worker = threading.Thread(target=post)
    worker.start()
    try:
        with srv.client() as c:
            end = time.monotonic() + 10
            while time.monotonic() < end:  # wait until the request is in flight
                if metric_value(c.get("/metrics").text, "lidarseg_requests_in_flight") >= 1:
                    break
                time.sleep(0.02)
            time.sleep(0.1)
            assert "r" not in result, "the request finished before SIGTERM: make it bigger"
            srv.proc.send_signal(signal.SIGTERM)
            time.sleep(0.05)
            ready = c.get("/readyz")
            assert ready.status_code == 503 and ready.json()["status"] == "draining"
            assert c.get("/healthz").status_code == 200
            late = c.post("/v1/segment?format=kitti", content=frame_bytes(KITTI), headers=BIN)
            assert_error(late, 503, "draining")
        worker.join(60)
        assert result["r"].status_code == 200, result["r"].text
        assert len(result["r"].content) == 2 * len(load_frame(KITTI))
        assert srv.proc.wait(30) == 0, srv.output()
    finally:
        srv.stop()
        worker.join(60)


def test_bad_settings_fail_fast():
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT

    env = {
        **__import__("os").environ,
        "LIDARSEG_QUEUE_SIZE": "0",
        "LIDARSEG_RANGE_POLICY": "maybe",
        "LIDARSEG_PRECISION": "fp8",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "app", "serve", "--port", "1"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "queue_size" in proc.stderr and "range_policy" in proc.stderr
    assert "precision" in proc.stderr and "'fp8'" in proc.stderr
    for otel in ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, {"OTEL_TRACES_EXPORTER": "jaeger"}):
        otel = {**otel, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}
        proc = subprocess.run(  # a crash loop with status 1 before: now refused as settings
            [sys.executable, "-m", "app", "serve", "--port", "1"],
            cwd=REPO_ROOT,
            env={**env, "LIDARSEG_QUEUE_SIZE": "4", "LIDARSEG_RANGE_POLICY": "ignore",
                 "LIDARSEG_PRECISION": "auto", **otel},
            capture_output=True,
            text=True,
            timeout=120,
        )  # fmt: skip
        assert proc.returncode == 2, proc.stderr
        assert "bad settings" in proc.stderr and list(otel)[0] in proc.stderr


def test_a_model_that_fails_to_load_exits_3(tmp_path):
    """A corrupt weights file passes the settings (it exists) but fails in the loader: the server
    stops with status 3 and says why, instead of staying up never ready."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT

    weights = tmp_path / "bad.pt"
    weights.write_bytes(np.random.default_rng(0).bytes(3000))
    proc = subprocess.run(
        [sys.executable, "-m", "app", "serve", "--port", "0", "--weights", str(weights)],
        cwd=REPO_ROOT,
        env={**os.environ, "LIDARSEG_DEVICE": "cpu"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "model load failed" in proc.stderr and "could not be loaded" in proc.stderr
    # not a terminal: the access log is JSON, and so is every other line (uvicorn's, the
    # traceback's), which a log collector would otherwise split into garbage
    records = [json.loads(line) for line in proc.stderr.splitlines()]
    failed = next(r for r in records if r["message"] == "model load failed")
    assert failed["level"] == "error" and "Traceback" in failed["exception"]
    assert any(r["logger"].startswith("uvicorn") for r in records)
