"""Scoring predicted labels against labelled frames: confusion matrices, mIoU, per-class IoU,
accuracy (`python -m app evaluate` and train/evaluate.py print them).

Labels are SemanticKITTI .label files: uint32 per point, the lower 16 bits the raw semantic id.
Raw ids go through the standard SemanticKITTI learning map (semantic-kitti.yaml: raw -> 0..19,
0 = unlabelled / ignored), then shift to our ids 0..18 (car = 0 ... traffic-sign = 18) with
ignore = 255. Only points with a valid ground-truth class are scored; a point the pipeline
ignores (255: out of range, non-finite) counts as a miss for its ground-truth class.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from models.labels import map_raw_labels


def read_labels(path) -> np.ndarray:
    """uint8 [N] our class ids (255 = ignore) from a SemanticKITTI .label file."""
    raw = Path(path).read_bytes()
    if len(raw) % 4:
        raise ValueError(f"{path}: {len(raw)} bytes is not a whole number of uint32 labels")
    return map_raw_labels(np.frombuffer(raw, dtype=np.uint32))


def confusion(gt: np.ndarray, pred: np.ndarray, num_classes: int) -> np.ndarray:
    """int64 [C, C+1]: rows ground truth, columns prediction (last column: any other value,
    e.g. 255); points with gt outside 0..C-1 are dropped."""
    gt, pred = np.asarray(gt, np.int64), np.asarray(pred, np.int64)
    if gt.shape != pred.shape:
        raise ValueError(f"{gt.shape} ground truth vs {pred.shape} predictions")
    valid = (gt >= 0) & (gt < num_classes)
    gt, pred = gt[valid], pred[valid]
    pred = np.where((pred >= 0) & (pred < num_classes), pred, num_classes)
    return np.bincount(
        gt * (num_classes + 1) + pred, minlength=num_classes * (num_classes + 1)
    ).reshape(num_classes, -1)


def metrics_from_confusion(conf: np.ndarray, names: list[str]) -> dict:
    """{"miou", "per_class_iou", "num_scored", "accuracy"} from a [C, C+1] confusion (one frame's
    or pooled over frames): IoU = TP / (TP + FP + FN) for the classes present in the ground
    truth; miou is their mean (0 classes: miou 0)."""
    c = len(names)
    tp = np.diag(conf[:, :c]).astype(np.float64)
    gt_count = conf.sum(axis=1)
    pred_count = conf[:, :c].sum(axis=0)
    present = np.flatnonzero(gt_count > 0)
    ious = {names[i]: float(tp[i] / (gt_count[i] + pred_count[i] - tp[i])) for i in present}
    total = int(gt_count.sum())
    return {
        "miou": float(np.mean(list(ious.values()))) if ious else 0.0,
        "per_class_iou": ious,
        "num_scored": total,
        "accuracy": float(tp.sum() / total) if total else 0.0,
    }


def iou_metrics(gt: np.ndarray, pred: np.ndarray, names: list[str]) -> dict:
    """metrics_from_confusion of one frame plus "num_points" (scored or not)."""
    return {
        **metrics_from_confusion(confusion(gt, pred, len(names)), names),
        "num_points": int(len(gt)),
    }
