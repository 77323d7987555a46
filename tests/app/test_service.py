"""The service as a process: `python -m app serve` in a subprocess on a loopback port
(LIDARSEG_CR=0.25 for speed), for what only a real process shows: batching and queueing under
concurrent connections, deadlines, the SIGTERM drain, the `client` and `serve` commands. The HTTP
contract itself (routes, status codes, error bodies, headers, formats) is tested in process in
the test_contract_*.py files."""

from __future__ import annotations

import concurrent.futures
import json
import signal
import threading
import time

import httpx
import numpy as np
import pytest

from app.inference.builder import build_pipeline
from tests.conftest import load_frame, require_real_data

from tests.app.contract_helpers import BIN, KITTI, NUSCENES, WANT_BIN, assert_error, frame_bytes
from tests.app.service_helpers import Server, metric_value, parse_server_timing
from app.inference.pipeline import STAGES as REQUEST_STAGES

STAGES = {*REQUEST_STAGES, "total"}


@pytest.fixture(scope="module")
def server():
    require_real_data()
    srv = Server(max_body_bytes=4 * 1024 * 1024, max_points=150_000)
    yield srv
    assert srv.stop() == 0, srv.output()


@pytest.fixture(scope="module")
def pipeline():
    return build_pipeline("random", "cpu", 0.25)


# ---- load: batching, API keys, range policy -------------------------------------------------


def test_concurrent_requests_are_batched(pipeline):
    """Frames posted at once over separate connections run as one batch; each gets the labels it
    gets alone."""
    require_real_data()
    # three decodes at once: with the default (one slot per compute thread, 2 here) the third
    # request is refused with 503 whenever the other two are still decoding (a loaded machine)
    srv = Server(max_batch=4, max_wait_ms=300, decode_concurrency=3)
    try:
        with srv.client() as c:
            frames = [
                (NUSCENES, "nuscenes", "nuscenes"),
                (KITTI, "kitti", "kitti"),
                ("semantickitti/seq00_000000_subset50.bin", "kitti", "kitti"),
            ]
            alone = [pipeline.segment(np.array(load_frame(n)), s).labels for n, _, s in frames]
            barrier = threading.Barrier(len(frames))

            def post(item):
                name, fmt, _ = item
                body = frame_bytes(name)
                barrier.wait()
                return c.post(f"/v1/segment?format={fmt}", content=body, headers=WANT_BIN)

            with concurrent.futures.ThreadPoolExecutor(len(frames)) as pool:
                responses = list(pool.map(post, frames))
            for r, expected in zip(responses, alone):
                assert r.status_code == 200, r.text
                np.testing.assert_array_equal(np.frombuffer(r.content, np.uint8), expected)
                assert "queue" in parse_server_timing(r.headers["server-timing"])
            assert max(int(r.headers["x-batch-size"]) for r in responses) > 1
            text = c.get("/metrics").text
            assert metric_value(text, "lidarseg_batch_size_count") < 3 + 1  # batched (< runs)
    finally:
        assert srv.stop() == 0, srv.output()


def _concurrent_posts(c: httpx.Client, body: bytes, n: int) -> list[httpx.Response]:
    barrier = threading.Barrier(n)

    def post(_):
        barrier.wait()
        return c.post("/v1/segment?format=kitti", content=body, headers=WANT_BIN)

    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        return list(pool.map(post, range(n)))


def _big_frame(copies: int) -> bytes:
    # several KITTI frames stacked: far slower to segment than the requests take to arrive
    return np.concatenate([np.array(load_frame(KITTI))] * copies).tobytes()


def test_queue_full_gives_503_at_once():
    """One frame running, one queued (queue of 1): every other request gets 503 + Retry-After
    at once, and the two admitted ones still complete."""
    require_real_data()
    srv = Server(queue_size=1, max_batch=1, deadline_s=120, decode_concurrency=8)
    body = _big_frame(3)
    try:
        with srv.client() as c, concurrent.futures.ThreadPoolExecutor(1) as pool:
            first = pool.submit(c.post, "/v1/segment?format=kitti", content=body, headers=WANT_BIN)
            end = time.monotonic() + 10
            while time.monotonic() < end:  # wait until the worker has taken the first frame
                text = c.get("/metrics").text
                if (
                    metric_value(text, "lidarseg_requests_in_flight") >= 1
                    and metric_value(text, "lidarseg_queue_depth") == 0
                ):
                    break
                time.sleep(0.02)
            responses = _concurrent_posts(c, body, 4) + [first.result()]
            statuses = sorted(r.status_code for r in responses)
            assert statuses == [200, 200, 503, 503, 503], statuses
            for r in responses:
                if r.status_code == 503:
                    assert_error(r, 503, "queue_full")
                    assert int(r.headers["retry-after"]) >= 1
                else:
                    assert len(r.content) == len(body) // 16
            assert metric_value(c.get("/metrics").text, "lidarseg_queue_depth") == 0
    finally:
        assert srv.stop() == 0, srv.output()


def test_deadline_gives_504_and_frees_the_slot():
    """The running frame passes its deadline (504); the queued one expires and is dropped
    without running; afterwards the server serves a small frame normally."""
    require_real_data()
    srv = Server(queue_size=2, max_batch=1, deadline_s=0.2)
    try:
        with srv.client() as c:
            runs_before = metric_value(c.get("/metrics").text, "lidarseg_batch_size_count")
            responses = _concurrent_posts(c, _big_frame(3), 2)
            for r in responses:
                assert_error(r, 504, "deadline_exceeded")
            text = c.get("/metrics").text
            assert metric_value(text, "lidarseg_dropped_total", 'reason="deadline"') >= 1
            # the running frame's answer went nowhere: counted as a wasted run
            assert metric_value(text, "lidarseg_wasted_runs_total", 'reason="deadline"') == 1
            assert metric_value(text, "lidarseg_batch_size_count") - runs_before <= 1
            time.sleep(3)  # let the running frame finish
            small = np.array(load_frame(NUSCENES))[:200].tobytes()
            for _ in range(20):  # a tiny frame fits the deadline once the worker is free
                r = c.post("/v1/segment?format=nuscenes", content=small, headers=WANT_BIN)
                if r.status_code == 200:
                    break
                assert_error(r, 504, "deadline_exceeded")
                time.sleep(1)
            assert r.status_code == 200 and len(r.content) == 200
            assert c.get("/readyz").status_code == 200
    finally:
        assert srv.stop() == 0, srv.output()


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


def test_client_command(server):
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT

    frame = str(require_real_data() / NUSCENES)
    one = subprocess.run(
        [sys.executable, "-m", "app", "client", frame, "--url", server.url],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert one.returncode == 0, one.stderr
    assert "34688 points" in one.stdout
    assert (
        sum(int(ln.split()[-1]) for ln in one.stdout.splitlines() if ln.startswith("  ")) == 34688
    )
    timing = json.loads(one.stdout.split("timing_ms ", 1)[1].splitlines()[0])
    assert STAGES <= set(timing)
    load = subprocess.run(
        [
            sys.executable,
            "-m",
            "app",
            "client",
            frame,
            "--url",
            server.url,
            "--repeat",
            "4",
            "--concurrency",
            "2",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert load.returncode == 0, load.stderr
    report = json.loads(load.stdout.strip().splitlines()[-1])
    assert report["statuses"] == {"200": 4} and report["p50"] > 0 and report["throughput_rps"] > 0


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


def test_a_slow_upload_shows_in_the_receive_stage(server):
    """Server-Timing's stages add up to its total: the body's arrival is the receive stage (a
    0.5 s pause mid-body was in no stage before)."""
    body = np.array(load_frame(NUSCENES))[:2000].astype(np.float32).tobytes()

    def slowly():
        yield body[: len(body) // 2]
        time.sleep(0.5)
        yield body[len(body) // 2 :]

    r = httpx.post(
        f"{server.url}/v1/segment?format=nuscenes", content=slowly(), headers=WANT_BIN, timeout=60
    )
    assert r.status_code == 200, r.text
    stages = parse_server_timing(r.headers["server-timing"])
    assert stages["receive"] >= 400  # the pause
    assert sum(v for k, v in stages.items() if k != "total") >= 0.8 * stages["total"]
