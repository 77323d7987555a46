"""The inference worker's test stand-ins: a pipeline that takes a set time per point, tagged
frames, and a wait for the worker to take its queue."""

from __future__ import annotations

import threading
import time

import numpy as np

from app.service.worker import InferenceWorker


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


def wait_until_taken(w: InferenceWorker) -> None:
    """Returns once the worker has taken every submitted job off the queue."""
    end = time.monotonic() + 30
    while w.depth and time.monotonic() < end:
        time.sleep(0.001)
    assert w.depth == 0
