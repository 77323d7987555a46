"""The inference worker with a stand-in pipeline: deadline-aware admission, abandoned jobs never
run, the supervised loop (an injected failure), /readyz following the worker's life, the heap trim
and the frame's release, and a frame given up counted once (the batching tests:
test_worker_batching.py)."""

from __future__ import annotations

import time

import httpx
import pytest

from app.service.admission import DeadlineExceeded
from app.service.worker import InferenceWorker, WorkerStats
from tests.app.worker_helpers import FakePipeline, frame, wait_until_taken


def test_admits_only_what_can_finish_in_time():
    pipe = FakePipeline(ms_per_point=0.01)  # 20k points: 0.2 s
    w = InferenceWorker(pipe, queue_size=16, max_batch=1)
    w.submit(frame(0), "kitti", time.monotonic() + 30).future.result(30)  # measures the cost
    assert w.cost.ms_per_point >= 0.01
    pipe.gate.clear()  # hold the next batch
    first = w.submit(frame(1), "kitti", time.monotonic() + 30)
    tight = time.monotonic() + 1.0
    # five frames queued behind one that takes >= 0.2 s: each needs >= 0.2 s more
    admitted, refused = [], 0
    for tag in range(2, 12):
        try:
            admitted.append(w.submit(frame(tag), "kitti", tight))
        except DeadlineExceeded:
            refused += 1
    pipe.gate.set()
    first.future.result(30)
    done = [j for j in admitted if j.future.exception(30) is None]
    # what was admitted fits the deadline by the measured cost; the rest was refused unrun
    assert refused >= 5 and len(admitted) <= 5
    assert all(j.future.result() == 20_000 for j in done)
    assert sorted(pipe.ran) == sorted([0, 1] + [int(j.points[0, 0]) for j in done])
    w.stop(30)


def test_abandoned_job_is_not_run():
    pipe = FakePipeline()
    w = InferenceWorker(pipe, queue_size=4, max_batch=1)
    pipe.gate.clear()
    running = w.submit(frame(1), "kitti", time.monotonic() + 30)
    time.sleep(0.2)  # the worker took it
    waiting = w.submit(frame(2), "kitti", time.monotonic() + 30)
    w.cancel(waiting)  # its client went away
    assert waiting.future.cancelled() and w.depth == 0
    pipe.gate.set()
    running.future.result(30)
    w.stop(30)
    assert pipe.ran == [1]


def test_loop_failure_is_logged_and_the_worker_restarts(caplog):
    pipe = FakePipeline()
    calls = {"n": 0}

    def on_batch(_size):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected failure")

    w = InferenceWorker(pipe, queue_size=4, max_batch=1, stats=WorkerStats(on_batch=on_batch))
    failed = w.submit(frame(1), "kitti", time.monotonic() + 30)
    with pytest.raises(RuntimeError, match="injected"):
        failed.future.result(30)
    ok = w.submit(frame(2), "kitti", time.monotonic() + 30)
    assert ok.future.result(30) == 20_000
    assert w.restarts == 1 and w.alive
    assert "worker loop failed" in caplog.text
    w.stop(30)
    assert not w.alive


def test_readyz_checks_the_worker_is_alive():
    """/readyz is 200 with a live worker and 503 once its thread has ended (in-process app, no
    model: the state is set by hand)."""
    import asyncio

    from app.service.config import Settings
    from app.service.main import create_app

    app = create_app(Settings(weights="random"))
    service = app.state.service
    service.ready = True
    service.worker = InferenceWorker(FakePipeline(), queue_size=2)

    async def readyz():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            return await c.get("/readyz")

    assert asyncio.run(readyz()).status_code == 200 and service.fatal_error is None
    service.worker.stop(30)
    r = asyncio.run(readyz())
    assert r.status_code == 503 and r.json()["status"] == "worker_dead"
    assert "worker" in service.fatal_error  # the server exits on it (status 3)
    service.draining = True
    assert service.fatal_error is None  # a worker stopped by the drain is no failure


def test_heap_trim_waits_for_a_pause_and_counts_points_over_batches(monkeypatch):
    from app import heap

    calls = []
    monkeypatch.setattr(heap, "MALLOC_TRIM", lambda pad: calls.append((pad, time.monotonic())))
    pipe = FakePipeline(ms_per_point=0.001)
    w = InferenceWorker(pipe, queue_size=16, **heap.worker_trim_hooks(100_000, idle_s=0.3))
    jobs = [w.submit(frame(tag), "kitti", time.monotonic() + 30) for tag in range(6)]
    jobs[-1].future.result(30)  # 120k points back to back: no trim between the frames
    done = time.monotonic()
    assert calls == []
    deadline = time.monotonic() + 10
    while not calls and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(calls) == 1 and calls[0][0] == 0 and calls[0][1] >= done + 0.25  # after the pause
    w.submit(frame(9, 90_000), "kitti", time.monotonic() + 30).future.result(30)
    time.sleep(0.8)
    assert len(calls) == 1  # 90k since the last trim: below the count, no trim
    w.submit(frame(10), "kitti", time.monotonic() + 30).future.result(30)
    time.sleep(0.8)
    assert len(calls) == 2  # 110k counted over two batches
    w.stop(30)
    assert heap.worker_trim_hooks(0, 0.5) == {}  # LIDARSEG_TRIM_AFTER_POINTS=0: off


class ReleasingPipeline(FakePipeline):
    """Records, at each release(), whether the batch's results were already handed over."""

    def __init__(self):
        super().__init__(ms_per_point=0.0)
        self.jobs: list = []
        self.releases: list[bool] = []

    def release(self):
        self.releases.append(all(j.future.done() for j in self.jobs))


def test_the_frame_is_freed_after_the_hand_over_unless_the_next_job_waits():
    pipe = ReleasingPipeline()
    w = InferenceWorker(pipe, queue_size=16, max_batch=1)
    job = w.submit(frame(0), "kitti", time.monotonic() + 30)
    pipe.jobs.append(job)
    job.future.result(30)
    deadline = time.monotonic() + 10
    while not pipe.releases and time.monotonic() < deadline:
        time.sleep(0.001)
    assert pipe.releases == [True]  # once, after the result was handed over
    # a job that arrives while the worker waits to free: its run frees the last frame first
    pipe.gate.clear()
    jobs = [w.submit(frame(t), "kitti", time.monotonic() + 30) for t in (1, 2)]
    pipe.gate.set()
    for j in jobs:
        j.future.result(30)
    time.sleep(0.05)
    assert len(pipe.releases) == 2  # after the second job only: the first found one waiting
    w.stop(30)


# ---- max_wait_s: a batch waits for frames that arrive after its first ---------------------------


def test_a_frame_given_up_counts_once_as_dropped_or_as_a_wasted_run():
    """The route's give_up: a running frame's answer goes nowhere (a wasted run); a queued
    frame the worker let expire never ran (dropped only: it was also counted as a wasted run)."""
    from types import SimpleNamespace

    from app.service.metrics import Metrics
    from app.service.routes.waiting import give_up

    metrics = Metrics()
    drops: list[str] = []
    pipe = FakePipeline()
    pipe.gate.clear()
    w = InferenceWorker(pipe, 4, stats=WorkerStats(on_drop=drops.append))
    service = SimpleNamespace(worker=w, metrics=metrics)
    running = w.submit(frame(1, 10), "kitti", time.monotonic() + 30)
    wait_until_taken(w)
    expiring = w.submit(frame(2, 10), "kitti", time.monotonic() + 0.05)
    time.sleep(0.1)
    give_up(service, running, "client_gone")  # running: its run is wasted
    pipe.gate.set()
    with pytest.raises(DeadlineExceeded):
        expiring.future.result(30)  # the worker let it expire unrun
    give_up(service, expiring, "deadline")
    w.stop(30)

    def value(name: str, reason: str) -> float:
        return metrics.registry.get_sample_value(name, {"reason": reason}) or 0.0

    assert value("lidarseg_wasted_runs_total", "client_gone") == 1
    assert value("lidarseg_wasted_runs_total", "deadline") == 0
    assert drops == ["deadline"] and pipe.ran == [1]
