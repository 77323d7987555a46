"""How the inference worker (worker.py) forms a batch: the first queued job that may run, grown
with the queued jobs that can join it (as many as max_batch frames and max_batch_points points,
every frame still able to finish by its deadline) and, with max_wait_s (LIDARSEG_MAX_WAIT_MS), with
jobs submitted while it waits, counted from its first frame and never past what its deadlines
allow (_wait_end). InferenceWorker takes these methods from BatchForming, its base class: they run
on its thread, under its lock, on the queue and settings it holds.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Callable

from app.service.admission import CostModel, Job, can_finish, estimated_end, refuse

# A batch waiting for more frames (max_wait_s) spends at most this share of its slack: the time
# its earliest deadline leaves beyond the estimated run. The estimate is a median and the answer
# still has to go out, so waiting up to the last estimated moment would make the deadline a coin
# toss for frames that would have made it without the wait.
WAIT_SLACK_SHARE = 0.5


class BatchForming:
    """InferenceWorker's batch forming; the worker sets the attributes below and calls
    _take_batch from its loop."""

    cost: CostModel
    max_batch: int
    max_wait_s: float
    max_batch_points: int | None
    _jobs: collections.deque[Job]
    _cond: threading.Condition
    _stopping: bool
    _busy: list[Job]
    _busy_until: float
    _dropped: Callable[[str], object]  # a job dropped unrun, by its reason
    _depth: Callable[[], object]  # the queue's depth changed

    def _take_batch(self) -> list[Job] | None:
        """The next batch to run (None once stopping with nothing queued): the first job that
        may run, grown by _fill."""
        with self._cond:
            first = self._take_first()
            if first is None:
                return None
            batch = [first]
            self._busy = batch  # while it fills too: not idle, and failed by the loop on an error
            self._fill(batch, time.monotonic())
            self._busy_until = estimated_end(self.cost, batch, time.monotonic())
            self._depth()
            return batch

    def _take_first(self) -> Job | None:
        """Pops jobs until one may run (refuse drops the others); None once stopping with an
        empty queue."""
        while True:
            while not self._jobs:
                if self._stopping:
                    return None
                self._cond.wait()
            job = self._jobs.popleft()
            contended = bool(self._jobs)  # a job alone runs whatever the estimate
            if not refuse(self.cost, job, time.monotonic(), self._dropped, contended):
                return job

    def _fill(self, batch: list[Job], taken: float) -> None:
        """Grows `batch` (its first job taken at `taken`) up to max_batch with the queued jobs
        that can join, then, while the queue is empty, with jobs submitted until _wait_end. A
        queued job that cannot join ends the wait: holding the batch would only delay it."""
        while len(batch) < self.max_batch:
            if self._grow(batch):
                continue
            if self._jobs or self.max_wait_s <= 0 or not self._wait_more(batch, taken):
                return  # (max_wait_s 0, the default: no estimate made for a wait never taken)

    def _grow(self, batch: list[Job]) -> bool:
        """Adds one waiting job that every frame of the batch can afford and that keeps the
        batch within max_batch_points; False when none."""
        now = time.monotonic()
        room = (
            None
            if self.max_batch_points is None
            else self.max_batch_points - sum(j.size for j in batch)
        )
        for job in list(self._jobs):
            if job.layer_timing != batch[0].layer_timing or (room is not None and room < job.size):
                continue
            if refuse(self.cost, job, now, self._dropped):
                self._jobs.remove(job)
                continue
            if can_finish(self.cost, (*batch, job), now):
                self._jobs.remove(job)
                batch.append(job)
                return True
        return False

    def _wait_end(self, batch: list[Job], taken: float) -> float:
        """Until when `batch` may wait for more jobs (monotonic): max_wait_s after its first job
        was taken (not reset per arrival), and no later than WAIT_SLACK_SHARE of the slack its
        deadlines leave, so the run keeps room to finish by them. With max_wait_s = 0 it is
        `taken` at the latest: no wait, a lone frame's latency unchanged."""
        slack = min(j.deadline for j in batch) - estimated_end(self.cost, batch, taken)
        return taken + min(self.max_wait_s, WAIT_SLACK_SHARE * slack)

    def _wait_more(self, batch: list[Job], taken: float) -> bool:
        """Waits for a submit, a stop or the end of the batch's wait; False, at once, when the
        wait has ended or the worker stops (stop() wakes it: the batch runs, queued work drains)."""
        now = time.monotonic()
        remaining = self._wait_end(batch, taken) - now
        if remaining <= 0 or self._stopping:
            return False
        # what a submit admits behind: a job that joins or ends the wait runs with it or next
        self._busy_until = estimated_end(self.cost, batch, now)
        self._cond.wait(remaining)
        return True
