"""Validation during training: the model through the service's pipeline on the validation
frames (train/real.py VALIDATION_FRAMES), IoU over points with the standard learning map.

The score that selects the best checkpoint is the mean over the frames of each frame's mIoU over
the classes present in its ground truth. Validation frames are only ever scored here, never fed
to gradients.
"""

from __future__ import annotations

import copy
import time

import numpy as np

from app.inference.builder import pipeline_for
from app.inference.scoring import iou_metrics
from models.checkpoint_meta import make_meta

from .real import REAL_DIR, VALIDATION, frames_in_role, load_real, roles_of


def validate(model, voxel_size: float, frames=None, real_dir: str = str(REAL_DIR)) -> dict:
    """{"score": mean frame mIoU, "frames": {name: iou_metrics}} over `frames` (default: every
    validation frame of `real_dir`); `model` is not changed (a copy runs in eval mode)."""
    real_dir = str(real_dir)
    frames = frames_in_role(VALIDATION, real_dir) if frames is None else frames
    for name in frames:
        if roles_of(real_dir).get(name) != VALIDATION:
            raise ValueError(f"{name!r} is not a validation frame")
    pipeline = pipeline_for(copy.deepcopy(model), make_meta(voxel_size=voxel_size))
    names = pipeline.meta["class_names"]
    out = {}
    for name in frames:
        points, labels, _ = load_real(name, real_dir)
        pred = pipeline.segment(np.ascontiguousarray(points), "kitti").labels
        out[name] = iou_metrics(labels, pred, names)
    return {"score": float(np.mean([m["miou"] for m in out.values()])), "frames": out}


class Progress:
    """One human-readable line per step: step, loss, steps/s (over the last `window` steps),
    ETA, and the last validation score."""

    def __init__(self, total: int, start: int, window: int = 20):
        self.total, self.window = total, window
        self.marks = [(start, time.perf_counter())]
        self.last_val: str = "-"

    def line(self, step: int, loss: float, lr: float, voxels: int) -> str:
        self.marks = (self.marks + [(step, time.perf_counter())])[-(self.window + 1) :]
        (s0, t0), (s1, t1) = self.marks[0], self.marks[-1]
        rate = (s1 - s0) / max(t1 - t0, 1e-9)
        eta = (self.total - step) / rate if rate > 0 else float("inf")
        return (
            f"step {step}/{self.total} loss {loss:.4f} lr {lr:.2e} voxels {voxels} "
            f"{rate:.3f} steps/s ETA {eta / 60:.0f} min val mIoU {self.last_val}"
        )
