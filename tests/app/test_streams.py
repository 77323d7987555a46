"""X-Stream-Id: a newer frame of a sensor's stream drops that stream's frames still queued
(admission.supersede), each answered 409 superseded and counted as lidarseg_dropped{reason=
"superseded"}; frames running or of other streams are answered as usual."""

from __future__ import annotations

import asyncio
import time

import pytest

from app.service.admission import SUPERSEDED, Superseded
from app.service.routes.waiting import Deadline, request_stream, wait_result
from app.service.state import ServiceError
from app.service.worker import InferenceWorker, WorkerStats
from tests.app.contract_helpers import NUSCENES, WANT_BIN, frame_bytes, serving
from tests.app.inproc_helpers import asgi_request, ready_service
from tests.app.worker_helpers import FakePipeline, frame, queued_job, wait_until_taken
from tests.conftest import require_real_data


def test_a_newer_frame_of_a_stream_drops_its_queued_ones_only():
    pipe = FakePipeline()
    pipe.gate.clear()  # the first frame runs and holds the worker
    drops: list[str] = []
    w = InferenceWorker(pipe, 8, stats=WorkerStats(on_drop=drops.append))
    due = time.monotonic() + 30
    running = w.submit(frame(1, 10), "kitti", due, stream="front")
    wait_until_taken(w)
    older = w.submit(frame(2, 10), "kitti", due, stream="front")
    other = w.submit(frame(3, 10), "kitti", due, stream="rear")
    anonymous = w.submit(frame(4, 10), "kitti", due)
    assert w.depth == 3
    newest = w.submit(frame(5, 10), "kitti", due, stream="front")
    assert w.depth == 3  # the older "front" frame left the queue
    with pytest.raises(Superseded, match="'front'"):
        older.future.result(0)
    assert older.abandoned == SUPERSEDED and drops == [SUPERSEDED]
    pipe.gate.set()
    for job in (running, other, anonymous, newest):
        job.future.result(30)
    w.stop(30)
    assert sorted(pipe.ran) == [1, 3, 4, 5]  # the running "front" frame was not dropped


def test_the_superseded_route_answers_409():
    """wait_result: the worker failed the job with Superseded: 409 superseded, and the job is not
    given up again (it left the queue already)."""
    service = ready_service()
    cancels: list[str] = []

    class Worker:
        def cancel(self, job, reason):
            cancels.append(reason)
            return True

    service.worker = Worker()
    queued = queued_job(time.monotonic() + 30)
    queued.future.set_exception(Superseded("a newer frame of stream 'front' arrived"))
    deadline = Deadline(time.monotonic() + 30, "30 s (LIDARSEG_DEADLINE_S)")
    with pytest.raises(ServiceError) as e:
        asyncio.run(wait_result(asgi_request([]), service, queued, deadline))
    assert (e.value.status, e.value.code) == (409, "superseded")
    assert "'front'" in e.value.detail and cancels == []


@pytest.mark.parametrize(
    "values, want",
    [
        ([], None),
        ([b"front"], "front"),
        ([b"velodyne/top:0.rear-1_a"], "velodyne/top:0.rear-1_a"),
        ([b"x" * 64], "x" * 64),
    ],
)
def test_a_stream_id_is_read(values, want):
    headers = [(b"x-stream-id", v) for v in values]
    assert request_stream(asgi_request(headers)) == want


@pytest.mark.parametrize(
    "values",
    [[b""], [b"x" * 65], [b"front lidar"], [b"caf\xc3\xa9"], [b"a", b"b"]],
    ids=["empty", "65 chars", "space", "non-ascii", "twice"],
)
def test_a_bad_stream_id_is_a_400(values):
    headers = [(b"x-stream-id", v) for v in values]
    with pytest.raises(ServiceError) as e:
        request_stream(asgi_request(headers))
    assert (e.value.status, e.value.code) == (400, "invalid_request")
    assert "X-Stream-Id" in e.value.detail


def test_through_the_app_a_stream_id_is_checked_and_segmented():
    require_real_data()
    with serving() as client:
        body = frame_bytes(NUSCENES)
        url = "/v1/segment?format=nuscenes"
        bad = client.post(url, content=body, headers={**WANT_BIN, "X-Stream-Id": "a b"})
        assert bad.status_code == 400 and bad.json()["error"] == "invalid_request"
        good = client.post(url, content=body, headers={**WANT_BIN, "X-Stream-Id": "front"})
        assert good.status_code == 200 and len(good.content) == 34688
        spec = client.get("/openapi.json").json()["paths"]["/v1/segment"]["post"]
        assert "409" in spec["responses"]
        assert any(p["name"] == "X-Stream-Id" for p in spec["parameters"])


def test_the_client_sends_its_stream_id():
    from app.client import ServiceClient

    assert ServiceClient("http://x", stream_id="front").headers["X-Stream-Id"] == "front"
    assert "X-Stream-Id" not in ServiceClient("http://x").headers
