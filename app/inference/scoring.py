"""Evaluate a model on one labelled KITTI frame: mIoU, per-class IoU, accuracy (one JSON line).

    python -m app evaluate FRAME.bin LABELS.label [--weights W] [--cr CR] [--device D]

Labels are SemanticKITTI .label files: uint32 per point, the lower 16 bits the raw semantic id.
Raw ids go through the standard SemanticKITTI learning map (semantic-kitti.yaml: raw -> 0..19,
0 = unlabelled / ignored), then shift to our ids 0..18 (car = 0 ... traffic-sign = 18) with
ignore = 255. Only points with a valid ground-truth class are scored; a point the pipeline
ignores (255: out of range, non-finite) counts as a miss for its ground-truth class.
"""
from __future__ import annotations

import json

import numpy as np

IGNORE = 255
# semantic-kitti.yaml learning_map: raw id -> 0..19 (0 = ignore); unknown raw ids -> 0
LEARNING_MAP = {
    0: 0, 1: 0, 10: 1, 11: 2, 13: 5, 15: 3, 16: 5, 18: 4, 20: 5, 30: 6, 31: 7, 32: 8, 40: 9,
    44: 10, 48: 11, 49: 12, 50: 13, 51: 14, 52: 0, 60: 9, 70: 15, 71: 16, 72: 17, 80: 18,
    81: 19, 99: 0, 252: 1, 253: 7, 254: 6, 255: 8, 256: 5, 257: 5, 258: 4, 259: 5,
}


def learning_lut() -> np.ndarray:
    """uint8 [65536]: raw 16-bit semantic id -> our class id 0..18, or 255 (ignore)."""
    lut = np.full(1 << 16, IGNORE, np.uint8)
    for raw, learned in LEARNING_MAP.items():
        lut[raw] = IGNORE if learned == 0 else learned - 1
    return lut


def map_raw_labels(raw: np.ndarray) -> np.ndarray:
    return learning_lut()[np.asarray(raw).astype(np.uint32) & 0xFFFF]


def read_labels(path) -> np.ndarray:
    """uint8 [N] our class ids (255 = ignore) from a SemanticKITTI .label file."""
    return map_raw_labels(np.fromfile(path, dtype=np.uint32))


def confusion(gt: np.ndarray, pred: np.ndarray, num_classes: int) -> np.ndarray:
    """int64 [C, C+1]: rows ground truth, columns prediction (last column: any other value,
    e.g. 255); points with gt outside 0..C-1 are dropped."""
    gt, pred = np.asarray(gt, np.int64), np.asarray(pred, np.int64)
    if gt.shape != pred.shape:
        raise ValueError(f"{gt.shape} ground truth vs {pred.shape} predictions")
    valid = (gt >= 0) & (gt < num_classes)
    gt, pred = gt[valid], pred[valid]
    pred = np.where((pred >= 0) & (pred < num_classes), pred, num_classes)
    return np.bincount(gt * (num_classes + 1) + pred,
                       minlength=num_classes * (num_classes + 1)).reshape(num_classes, -1)


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
    return {"miou": float(np.mean(list(ious.values()))) if ious else 0.0,
            "per_class_iou": ious, "num_scored": total,
            "accuracy": float(tp.sum() / total) if total else 0.0}


def iou_metrics(gt: np.ndarray, pred: np.ndarray, names: list[str]) -> dict:
    """metrics_from_confusion of one frame plus "num_points" (scored or not)."""
    return {**metrics_from_confusion(confusion(gt, pred, len(names)), names),
            "num_points": int(len(gt))}


def evaluate(frame_path, label_path, weights: str | None = None, cr: float = 1.0,
             device: str = "cpu", fmt: str | None = None, precision: str | None = None) -> dict:
    from app.cli import load_model
    from app.codecs.files import read_frame
    from app.inference.pipeline import SegmentationPipeline
    from app.inference.voxelize import VoxelizeConfig

    points, sensor = read_frame(str(frame_path), fmt)
    gt = read_labels(label_path)
    if len(gt) != len(points):
        raise ValueError(f"{frame_path}: {len(points)} points but {label_path}: {len(gt)} labels")
    model, names, voxel = load_model(weights, cr)
    result = SegmentationPipeline(model, VoxelizeConfig(voxel_size=voxel), device,
                                  precision=precision).segment(points, sensor)
    return iou_metrics(gt, result.labels, names)


def cmd_evaluate(args) -> int:
    print(json.dumps(evaluate(args.frame, args.labels, args.weights, args.cr, args.device,
                              args.format, getattr(args, "precision", None))))
    return 0
