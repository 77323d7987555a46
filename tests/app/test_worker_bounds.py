"""The worker at its edges: the idle trim (on_idle) never runs once a job has come in during its
wait, and a queued job cancelled counts one drop and never runs (a batch filling
max_batch_points exactly: test_worker_batching.py)."""

from __future__ import annotations

import time

from app.service.worker import InferenceWorker, WorkerStats
from tests.app.worker_helpers import FakePipeline, frame, wait_until_taken


def test_a_job_that_comes_during_the_idle_wait_skips_the_trim():
    """The worker waits idle_s on an empty queue before on_idle (a heap trim); a submit wakes
    it, and the job runs with no trim before it (nor after it: the queue was not idle_s empty)."""
    calls: list[int] = []
    pipe = FakePipeline(ms_per_point=0.0)
    w = InferenceWorker(pipe, queue_size=4, on_idle=lambda: calls.append(1), idle_s=60)
    time.sleep(0.3)  # the worker is in its idle wait by now (if not, the test proves less)
    job = w.submit(frame(1, 10), "kitti", time.monotonic() + 60)
    assert job.future.result(30) == 10
    assert calls == []
    w.stop(30)
    assert not w.alive and calls == []


def test_a_queued_job_cancelled_counts_one_drop_and_never_runs():
    """cancel() takes a queued job out (True) and counts it dropped once; a job the worker has
    taken is not cancelled there (False: its run is the route's to count)."""
    drops: list[str] = []
    pipe = FakePipeline()
    pipe.gate.clear()
    w = InferenceWorker(pipe, 4, stats=WorkerStats(on_drop=drops.append))
    running = w.submit(frame(1, 10), "kitti", time.monotonic() + 60)
    wait_until_taken(w)
    queued = w.submit(frame(2, 10), "kitti", time.monotonic() + 60)
    assert w.cancel(queued, "client_gone") and queued.future.cancelled()
    assert w.depth == 0 and drops == ["client_gone"]
    assert not w.cancel(running, "client_gone")
    pipe.gate.set()
    assert running.future.result(30) == 10
    w.stop(30)
    assert drops == ["client_gone"] and pipe.ran == [1]
