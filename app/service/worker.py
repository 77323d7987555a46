"""One inference thread per device, fed by a bounded queue; waiting frames run as one batch.

submit() never blocks: a full queue raises QueueFull at once (the route answers 503). Every job
carries a deadline; the worker drops a job whose deadline passed while it waited (it never runs),
and a route that gives up on a job cancels it, which frees its slot immediately.
"""
from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from app.inference.pipeline import FrameResult, SegmentationPipeline

log = logging.getLogger("lidarseg.worker")


class QueueFull(Exception):
    pass


class DeadlineExceeded(Exception):
    pass


class WorkerStopped(Exception):
    pass


@dataclass
class Job:
    points: np.ndarray
    sensor: str
    layer_timing: bool
    deadline: float                       # time.monotonic()
    enqueued: float = field(default_factory=time.monotonic)
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    queue_ms: float = 0.0
    batch_size: int = 0
    trace: object = None                  # the request's trace (the pipeline run links to it)


@dataclass
class WorkerStats:
    on_batch: object = None               # callback(batch_size) for metrics
    on_depth: object = None               # callback(queue depth)
    on_drop: object = None                # callback() per job dropped unrun (deadline)
    on_run: object = None                 # callback(jobs) -> context manager around a run


class InferenceWorker:
    def __init__(self, pipeline: SegmentationPipeline, queue_size: int, max_batch: int = 1,
                 max_wait_s: float = 0.0, stats: WorkerStats | None = None):
        self.pipeline, self.queue_size = pipeline, queue_size
        self.max_batch, self.max_wait_s = max_batch, max_wait_s
        self.stats = stats or WorkerStats()
        self._jobs: collections.deque[Job] = collections.deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._busy = 0                    # jobs taken off the queue and not finished yet
        self._thread = threading.Thread(target=self._loop, name="lidarseg-worker", daemon=True)
        self._thread.start()

    # ---- route side ----------------------------------------------------------------------
    def submit(self, points: np.ndarray, sensor: str, deadline: float,
               layer_timing: bool = False, trace: object = None) -> Job:
        job = Job(points, sensor, layer_timing, deadline, trace=trace)
        with self._cond:
            if self._stopping:
                raise WorkerStopped("the worker is shutting down")
            if len(self._jobs) >= self.queue_size:
                raise QueueFull(f"{len(self._jobs)} requests already waiting")
            self._jobs.append(job)
            self._depth()
            self._cond.notify()
        return job

    def cancel(self, job: Job) -> None:
        """The caller gave up (deadline): drop the job if it still waits."""
        with self._cond:
            try:
                self._jobs.remove(job)
            except ValueError:
                return
            self._depth()
        job.future.cancel()
        self._dropped()

    @property
    def depth(self) -> int:
        return len(self._jobs)

    @property
    def idle(self) -> bool:
        with self._cond:
            return not self._jobs and not self._busy

    def stop(self, timeout: float | None = None) -> None:
        """Finishes the queued work, then ends the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout)

    # ---- worker thread -------------------------------------------------------------------
    def _dropped(self):
        if self.stats.on_drop:
            self.stats.on_drop()

    def _depth(self):
        if self.stats.on_depth:
            self.stats.on_depth(len(self._jobs))

    def _take_batch(self) -> list[Job] | None:
        with self._cond:
            while not self._jobs:
                if self._stopping:
                    return None
                self._cond.wait()
            first = self._jobs.popleft()
            batch = [first]
            wait_until = time.monotonic() + self.max_wait_s
            while len(batch) < self.max_batch:
                same = next((j for j in self._jobs if j.layer_timing == first.layer_timing), None)
                if same is not None:
                    self._jobs.remove(same)
                    batch.append(same)
                    continue
                remaining = wait_until - time.monotonic()
                if remaining <= 0 or self._stopping:
                    break
                self._cond.wait(remaining)
            self._busy = len(batch)
            self._depth()
            return batch

    def _loop(self):
        while True:
            batch = self._take_batch()
            if batch is None:
                return
            try:
                self._run(batch)
            finally:
                with self._cond:
                    self._busy = 0

    def _run(self, batch: list[Job]):
        now = time.monotonic()
        live = []
        for job in batch:
            if job.future.cancelled():
                self._dropped()
                continue
            if now >= job.deadline:  # expired while queued: never run
                job.future.set_exception(DeadlineExceeded("deadline passed while queued"))
                self._dropped()
                continue
            if not job.future.set_running_or_notify_cancel():
                continue
            job.queue_ms = (now - job.enqueued) * 1e3
            job.batch_size = 0
            live.append(job)
        if not live:
            return
        for job in live:
            job.batch_size = len(live)
        if self.stats.on_batch:
            self.stats.on_batch(len(live))
        around = self.stats.on_run(live) if self.stats.on_run else contextlib.nullcontext()
        try:
            with around:
                results: list[FrameResult] = self.pipeline.run(
                    [j.points for j in live], [j.sensor for j in live],
                    layer_timing=live[0].layer_timing)
        except Exception as e:  # noqa: BLE001 - delivered to every waiting request
            log.exception("pipeline failed on a batch of %d", len(live))
            for job in live:
                job.future.set_exception(e)
            return
        for job, result in zip(live, results):
            job.future.set_result(result)
