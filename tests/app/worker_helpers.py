"""The inference worker's test stand-ins: a pipeline that takes a set time per point, tagged
frames, and a wait for the worker to take its queue."""

from __future__ import annotations

import threading
import time

import numpy as np

from app.service.admission import Job
from app.service.worker import InferenceWorker, WorkerStats


class FakePipeline:
    """Takes `ms_per_point` per point; records every frame it ran (by its first value)."""

    def __init__(self, ms_per_point: float = 0.01):
        self.ms_per_point, self.ran = ms_per_point, []
        self.gate = threading.Event()
        self.gate.set()

    def run(self, frames, sensors, layer_timing=False, **_):
        self.gate.wait(30)
        time.sleep(sum(len(f) for f in frames) * self.ms_per_point / 1e3)
        self.ran.extend(int(f[0, 0]) for f in frames)
        return [len(f) for f in frames]


def frame(tag: int, n: int = 20_000) -> np.ndarray:
    pts = np.zeros((n, 4), np.float32)
    pts[0, 0] = tag
    return pts


def queued_job(deadline: float) -> Job:
    """A job of ten points due at `deadline` (time.monotonic()), as the worker makes them."""
    return Job(np.zeros((10, 4), np.float32), "kitti", False, deadline)


def wait_until_taken(w: InferenceWorker) -> None:
    """Returns once the worker has taken every submitted job off the queue."""
    end = time.monotonic() + 30
    while w.depth and time.monotonic() < end:
        time.sleep(0.001)
    assert w.depth == 0


def batched(first: int, rest: list[int], max_batch_points: int) -> tuple[list, list[int], list]:
    """Frames of `rest` points queued while a frame of `first` points runs, under
    max_batch_points (max_batch 4): (each frame's result, the batch sizes, the run order)."""
    sizes: list[int] = []
    pipe = FakePipeline()
    pipe.gate.clear()  # hold the first run while the rest queue up
    w = InferenceWorker(
        pipe, 8, max_batch=4, stats=WorkerStats(on_batch=sizes.append),
        max_batch_points=max_batch_points,
    )  # fmt: skip
    jobs = [w.submit(frame(0, first), "kitti", time.monotonic() + 60)]
    wait_until_taken(w)
    jobs += [w.submit(frame(k, n), "kitti", time.monotonic() + 60) for k, n in enumerate(rest, 1)]
    pipe.gate.set()
    results = [j.future.result(30) for j in jobs]
    w.stop(30)
    return results, sizes, pipe.ran
