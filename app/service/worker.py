"""One inference thread per device, fed by a bounded queue; waiting frames run as one batch.

submit() never blocks: a full queue raises QueueFull at once (the route answers 503). With
max_wait_s (LIDARSEG_MAX_WAIT_MS), a batch taken with room left waits that long, counted from its
first frame, for more frames to join; never past what its deadlines allow (batch_forming.py
forms the batches). The worker admits only work that can still finish by its deadline: the jobs,
the cost model and the estimates live in admission.py. A route whose client gave up cancels its
job, which frees the slot and the job never runs (if it has not started).

The loop is supervised: an exception outside a batch's pipeline run is logged, the jobs it held
fail, and the loop starts again; `alive` says whether the thread runs (/readyz checks it).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, ContextManager

import numpy as np

from app.inference.pipeline import FrameResult, SegmentationPipeline
from app.service.admission import (
    DEADLINE,
    CostModel,
    Job,
    QueueFull,
    WorkerStopped,
    check_at_submit,
    start_jobs,
    supersede,
)
from app.service.batch_forming import BatchForming

log = logging.getLogger("lidarseg.worker")

# After handing a batch's results to the event loop, the worker waits this long (for the
# responses to go out) before freeing the frame's maps (pipeline.release), unless the next
# job is already there: freeing holds the GIL that the event loop needs to answer.
RELEASE_DELAY_S = 0.005


@dataclass
class WorkerStats:
    on_batch: Callable[[int], object] | None = None  # callback(batch_size) for metrics
    on_depth: Callable[[int], object] | None = None  # callback(queue depth)
    # callback(reason) per job dropped unrun: admission.DEADLINE or CLIENT_GONE
    on_drop: Callable[[str], object] | None = None
    # callback(jobs) -> context manager around a run
    on_run: Callable[[list[Job]], ContextManager[object]] | None = None
    on_restart: Callable[[], object] | None = None  # callback() per restart of the loop


class InferenceWorker(BatchForming):
    def __init__(
        self,
        pipeline: SegmentationPipeline,
        queue_size: int,
        max_batch: int = 1,
        max_wait_s: float = 0.0,
        stats: WorkerStats | None = None,
        after_batch=None,
        on_idle=None,
        idle_s: float | None = None,  # with on_idle: the settings' trim_idle_s (app/heap.py)
        max_batch_points: int | None = None,  # a batch's points in all (a lone job always runs)
    ):
        if on_idle is not None and idle_s is None:
            raise ValueError("on_idle needs idle_s: how long the queue stays empty first")
        self.pipeline, self.queue_size = pipeline, queue_size
        self.max_batch, self.max_wait_s = max_batch, max_wait_s
        self.max_batch_points = max_batch_points
        self.stats = stats or WorkerStats()
        self.cost = CostModel()
        self.after_batch = after_batch  # callback(points in the batch): counts for the trim
        self.on_idle, self.idle_s = on_idle, idle_s  # callback() once no job came for idle_s
        self.restarts = 0
        self._jobs: collections.deque[Job] = collections.deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._busy: list[Job] = []  # jobs taken off the queue and not finished yet
        self._busy_until = 0.0  # estimated end of the running batch (monotonic)
        self._thread = threading.Thread(target=self._loop, name="lidarseg-worker", daemon=True)
        self._thread.start()

    # ---- route side ----------------------------------------------------------------------
    def submit(
        self,
        points: np.ndarray,
        sensor: str,
        deadline: float,
        layer_timing: bool = False,
        trace: object = None,
        valid: object = None,
        stream: str | None = None,
    ) -> Job:
        """Queues a frame (stream: its sensor stream's id; its own queued frames are dropped as
        superseded, admission.supersede)."""
        job = Job(points, sensor, layer_timing, deadline, trace=trace, valid=valid, stream=stream)
        with self._cond:
            if self._stopping:
                raise WorkerStopped("the worker is shutting down")
            supersede(self._jobs, stream, self._dropped)
            if len(self._jobs) >= self.queue_size:
                raise QueueFull(f"{len(self._jobs)} requests already waiting")
            busy = bool(self._jobs or self._busy)
            check_at_submit(self.cost, job, self._jobs, busy, self._busy_until, self._dropped)
            self._jobs.append(job)
            self._depth()
            self._cond.notify()
        return job

    def cancel(self, job: Job, reason: str = DEADLINE) -> bool:
        """The caller gave up (reason: admission.DEADLINE or CLIENT_GONE): the job is dropped
        if it still waits in the queue (True); False when a batch holds it already (cancelling
        its future drops it as the batch starts) or it runs or ran (then its run is wasted)."""
        job.abandoned = reason
        with self._cond:
            try:
                self._jobs.remove(job)
            except ValueError:
                return False
            self._depth()
        job.future.cancel()
        self._dropped(reason)
        return True

    @property
    def depth(self) -> int:
        return len(self._jobs)

    @property
    def idle(self) -> bool:
        with self._cond:
            return not self._jobs and not self._busy

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float | None = None) -> None:
        """Finishes the queued work, then ends the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout)

    # ---- worker thread -------------------------------------------------------------------
    def _dropped(self, reason: str):
        if self.stats.on_drop:
            self.stats.on_drop(reason)

    def _depth(self):
        if self.stats.on_depth:
            self.stats.on_depth(len(self._jobs))

    def _release_after_hand_over(self) -> None:
        """pipeline.release() once the responses have had RELEASE_DELAY_S to go out, unless a
        job is waiting by then (its run frees the last frame first)."""
        release = getattr(self.pipeline, "release", None)  # test stand-ins may not have one
        if release is None:
            return
        with self._cond:
            if not self._jobs and not self._stopping:
                self._cond.wait(RELEASE_DELAY_S)
            if self._jobs:
                return
        release()

    def _loop(self):
        while True:
            try:
                self._wait_idle()
                batch = self._take_batch()
                if batch is None:
                    return
                self._run(batch)
            except Exception as e:  # noqa: BLE001 - supervised: log, fail the batch, go on
                log.exception("worker loop failed; restarting it")
                self.restarts += 1
                for job in self._busy:
                    if not job.future.done():
                        job.future.set_exception(e)
                if self.stats.on_restart:
                    self.stats.on_restart()
                time.sleep(0.05)
            finally:
                with self._cond:
                    self._busy, self._busy_until = [], 0.0

    def _wait_idle(self) -> None:
        """Calls on_idle (a heap trim) outside the lock once the queue has stayed empty for
        idle_s: work that would slow the next frame waits for a pause in the stream."""
        if self.on_idle is None:
            return
        with self._cond:
            if self._jobs or self._stopping:
                return
            self._cond.wait(self.idle_s)
            if self._jobs or self._stopping:
                return
        self.on_idle()

    def _run(self, batch: list[Job]):
        live = start_jobs(batch, time.monotonic(), self._dropped)
        if not live:
            return
        for job in live:
            job.batch_size = len(live)
        if self.stats.on_batch:
            self.stats.on_batch(len(live))
        around = self.stats.on_run(live) if self.stats.on_run else contextlib.nullcontext()
        points = sum(j.size for j in live)
        t0 = time.perf_counter()
        try:
            with around:
                results: list[FrameResult] = self.pipeline.run(
                    [j.points for j in live],
                    [j.sensor for j in live],
                    layer_timing=live[0].layer_timing,
                    valid=[j.valid for j in live],
                )
        except Exception as e:  # noqa: BLE001 - delivered to every waiting request
            log.exception("pipeline failed on a batch of %d", len(live))
            for job in live:
                job.future.set_exception(e)
            return
        self.cost.observe(points, (time.perf_counter() - t0) * 1e3)
        for job, result in zip(live, results):
            job.future.set_result(result)
        self._release_after_hand_over()
        if self.after_batch is not None:
            self.after_batch(points)
