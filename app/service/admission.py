"""Deadline admission for the inference worker (worker.py): its jobs, the refusals a route sees
(QueueFull, DeadlineExceeded, WorkerStopped), what a point costs, and whether a job can still
finish in time.

Every job carries a deadline, and the worker admits only work that can still finish in time: it
measures what a point costs (CostModel, over the batches it ran) and estimates each batch before
running it. Under contention (other work queued or running), a job that cannot finish by its
deadline is refused (DeadlineExceeded) without running: at submit when the work ahead already
rules it out (check_at_submit), else when the worker takes it (refuse); a batch only grows while
every frame in it can still finish (can_finish). A job alone always runs, so a stale estimate
cannot refuse work forever. As its batch starts, a job whose client gave up or whose deadline
passed while queued is dropped unrun (start_jobs).
"""

from __future__ import annotations

import collections
import concurrent.futures
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Collection, Iterable, MutableSequence

import numpy as np


class QueueFull(Exception):
    pass


class DeadlineExceeded(Exception):
    pass


class WorkerStopped(Exception):
    pass


class Superseded(Exception):
    """A newer frame of the same stream (X-Stream-Id) was queued before this one ran."""


class CostModel:
    """Milliseconds per point: the median of the last `keep` batches of at least `min_points`
    points (None until one ran; a small batch is mostly fixed overhead and says little). The
    median ignores one slow outlier (a first run) and one lucky run alike: too low an estimate
    admits frames that then miss their deadline (wasted work), too high a one refuses frames
    that would have made it."""

    def __init__(self, keep: int = 8, min_points: int = 10_000):
        self.min_points = min_points
        self.recent: collections.deque[float] = collections.deque(maxlen=keep)

    @property
    def ms_per_point(self) -> float | None:
        return statistics.median(self.recent) if self.recent else None

    def observe(self, points: int, ms: float) -> None:
        if points >= self.min_points:
            self.recent.append(ms / points)

    def seconds(self, points: int) -> float:
        per = self.ms_per_point
        return 0.0 if per is None else per * points / 1e3


# why a frame was dropped (or its run wasted: the first two)
DEADLINE, CLIENT_GONE, SUPERSEDED = "deadline", "client_gone", "superseded"


@dataclass
class Job:
    points: np.ndarray
    sensor: str
    layer_timing: bool
    deadline: float  # time.monotonic()
    enqueued: float = field(default_factory=time.monotonic)
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    queue_ms: float = 0.0
    batch_size: int = 0
    trace: object = None  # the request's trace (the pipeline run links to it)
    valid: object = None  # valid_mask's result from the route (computed once)
    abandoned: str | None = None  # why its caller gave up: DEADLINE or CLIENT_GONE
    stream: str | None = None  # X-Stream-Id: a newer frame of it drops this one while queued
    started: bool = False  # the worker took it to run (its answer is then computed, wanted or not)

    @property
    def given_up_for(self) -> str:
        """The reason a cancelled job was dropped (a cancel without one: its deadline)."""
        return self.abandoned or DEADLINE

    @property
    def size(self) -> int:
        return len(self.points)


def supersede(
    queued: MutableSequence[Job], stream: str | None, dropped: Callable[[str], object]
) -> None:
    """Drops from `queued` every job of `stream` (a newer frame of it is about to join): each
    fails with Superseded, its route answers 409, and dropped(SUPERSEDED) counts it. A job that a
    batch holds or that runs is no longer queued: it is answered as usual."""
    if stream is None:
        return
    for job in [j for j in queued if j.stream == stream]:
        queued.remove(job)
        job.abandoned = SUPERSEDED
        job.future.set_exception(
            Superseded(f"a newer frame of stream {stream!r} arrived before this one ran")
        )
        dropped(SUPERSEDED)


def estimated_end(cost: CostModel, jobs: Iterable[Job], start: float) -> float:
    """When `jobs`, run as one piece of work from `start` (monotonic), are estimated to end."""
    return start + cost.seconds(sum(j.size for j in jobs))


def can_finish(cost: CostModel, jobs: tuple[Job, ...], now: float) -> bool:
    """Whether `jobs`, run together from `now`, are estimated to end by every one's deadline."""
    return estimated_end(cost, jobs, now) <= min(j.deadline for j in jobs)


def check_at_submit(
    cost: CostModel,
    job: Job,
    queued: Collection[Job],
    busy: bool,
    busy_until: float,
    dropped: Callable[[str], object],
) -> None:
    """At submit: raises DeadlineExceeded (after dropped()) when, under contention (busy: work
    queued or running), the work queued ahead and `job` cannot finish by its deadline, starting
    once the running batch is estimated to end (busy_until, monotonic)."""
    if not busy:  # a job alone always runs
        return
    start = max(time.monotonic(), busy_until)
    need = estimated_end(cost, [*queued, job], start) - time.monotonic()
    if need > job.deadline - time.monotonic():
        dropped(DEADLINE)
        raise DeadlineExceeded(
            f"cannot finish before the deadline: the work queued "
            f"ahead and this frame are estimated at {need:.1f} s"
        )


def refuse(
    cost: CostModel, job: Job, now: float, dropped: Callable[[str], object], contended: bool = True
) -> bool:
    """When the worker takes a job: True (the job failed or was cancelled, and dropped(reason)
    called) when it cannot finish by its deadline if started now. Estimates refuse work only under
    contention: a job alone runs (and so refreshes the estimate; a stale one cannot refuse work
    forever)."""
    if job.future.cancelled():
        dropped(job.given_up_for)
        return True
    if now < job.deadline and (not contended or can_finish(cost, (job,), now)):
        return False
    what = "passed while queued" if now >= job.deadline else "cannot be met"
    job.future.set_exception(DeadlineExceeded(f"deadline {what}"))
    dropped(DEADLINE)
    return True


def start_jobs(batch: list[Job], now: float, dropped: Callable[[str], object]) -> list[Job]:
    """The jobs of a batch that start now, marked running with their time in the queue; the
    others never run: a job cancelled while the batch formed, or whose deadline passed while
    queued (it fails with DeadlineExceeded). dropped(reason) is called for each job dropped
    unrun."""
    live = []
    for job in batch:
        if job.future.cancelled():  # its caller gave up while the batch formed
            dropped(job.given_up_for)
            continue
        if now >= job.deadline:  # expired while queued: never run
            job.future.set_exception(DeadlineExceeded("deadline passed while queued"))
            dropped(DEADLINE)
            continue
        job.started = True  # before the future says so: a caller who cannot cancel sees it
        if not job.future.set_running_or_notify_cancel():  # cancelled a moment ago
            dropped(job.given_up_for)
            continue
        job.queue_ms = (now - job.enqueued) * 1e3
        live.append(job)
    return live
