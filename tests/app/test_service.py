"""The service as a process under concurrent connections: `python -m app serve` in a subprocess on
a loopback port (LIDARSEG_CR=0.25 for speed), for what only a real process shows: frames posted at
once run as one batch, a full queue answers 503 at once, and a deadline passed answers 504 and
frees the slot. The process's start and stop are tested in test_service_lifecycle.py, the `client`
command and Server-Timing over a real socket in test_service_client.py; the HTTP contract itself
(routes, status codes, error bodies, headers, formats) in process in the test_contract_*.py
files."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import httpx
import numpy as np
import pytest

from app.inference.builder import build_pipeline
from tests.conftest import load_frame, require_real_data

from tests.app.contract_helpers import KITTI, NUSCENES, WANT_BIN, assert_error, frame_bytes
from tests.app.service_helpers import Server, metric_value, parse_server_timing


@pytest.fixture(scope="module")
def pipeline():
    return build_pipeline("random", "cpu", 0.25)


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
