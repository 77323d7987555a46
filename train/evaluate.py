"""Scores a model on held-out synthetic frames and on the labelled real frames (one JSON).

    python -m train.evaluate [--weights default] [--frames 50] [--real-dir DIR] [--json OUT]

* held-out synthetic: seeds HELDOUT_SEED_START .. + frames - 1 (never drawn in training), one
  confusion matrix pooled over all frames; `miou` is the mean IoU over the classes present in
  their ground truth (SemanticKITTI's convention), `mean_frame_miou` the mean of per-frame mIoUs;
* fixed frame: the first held-out seed alone (tests/train/test_shipped_model.py checks the
  shipped weights reproduce it within 0.01);
* real: the validation frames of train/real.py's roles table (SemanticKITTI learning map, as
  `python -m app evaluate`), scored one by one, each with the confusion between the ground
  classes (road, parking, sidewalk, other-ground, terrain; rows ground truth, columns predicted,
  point counts); with --training-frames also the training-pool frames (marked as such: a fit,
  not a generalisation figure).
Points go through the service's own pipeline (SegmentationPipeline: voxelize, network, voxel
labels back to points), so these are the labels a client would get.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from app.codecs.files import read_frame
from app.inference.builder import build_pipeline
from app.inference.pipeline import SegmentationPipeline
from app.inference.scoring import confusion, iou_metrics, metrics_from_confusion, read_labels

from .data import HELDOUT_SEED_START, heldout_seeds, synthetic_frame
from .real import GROUND_CLASSES, REAL_DIR, TRAIN, VALIDATION, roles_of
from app.argtypes import positive_int

FIXED_FRAME_SEED = HELDOUT_SEED_START


def synthetic_labels(pipeline: SegmentationPipeline, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(ground truth, predicted) point labels of held-out synthetic frame `seed`."""
    points, gt = synthetic_frame(seed)
    return np.asarray(gt), pipeline.segment(np.ascontiguousarray(points), "kitti").labels


def evaluate_heldout(pipeline, names: list[str], frames: int) -> dict:
    conf = np.zeros((len(names), len(names) + 1), np.int64)
    per_frame = []
    for seed in heldout_seeds(frames):
        gt, pred = synthetic_labels(pipeline, seed)
        conf += confusion(gt, pred, len(names))
        per_frame.append(iou_metrics(gt, pred, names)["miou"])
    out = metrics_from_confusion(conf, names)
    out.update(
        seeds=[HELDOUT_SEED_START, HELDOUT_SEED_START + frames - 1],
        mean_frame_miou=float(np.mean(per_frame)),
        frame_miou=per_frame,
    )
    return out


def fixed_frame_miou(pipeline, names: list[str]) -> float:
    gt, pred = synthetic_labels(pipeline, FIXED_FRAME_SEED)
    return iou_metrics(gt, pred, names)["miou"]


def real_frames(real_dir: Path, roles=(VALIDATION,)) -> list[Path]:
    """The .bin files of the roles table's frames in `roles` (each with a .label beside it)."""
    names = sorted(n for n, r in roles_of(str(real_dir)).items() if r in roles)
    return [real_dir / f"{n}.bin" for n in names]


def evaluate_real(pipeline, names: list[str], real_dir: Path, roles=(VALIDATION,)) -> dict:
    out = {}
    for frame_path in real_frames(Path(real_dir), roles):
        name = frame_path.stem
        points, sensor = read_frame(str(frame_path), "kitti")
        gt = read_labels(frame_path.with_suffix(".label"))
        pred = pipeline.segment(points, sensor).labels
        conf = confusion(gt, pred, len(names))
        ground = list(GROUND_CLASSES)
        out[frame_path.name] = {
            **iou_metrics(gt, pred, names),
            "role": roles_of(str(real_dir))[name],
            "ground_confusion": {
                names[g]: {names[p]: int(conf[g, p]) for p in ground}
                for g in ground
                if conf[g].sum()
            },
        }
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m train.evaluate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--weights", default="default")
    ap.add_argument("--frames", type=positive_int, default=50, help="held-out synthetic frames")
    ap.add_argument(
        "--real-dir",
        default=str(REAL_DIR),
        help="labelled frames: the shared SemanticKITTI folder, or yours with a roles.json",
    )
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", default=None, help="also write the result here")
    ap.add_argument(
        "--training-frames",
        action="store_true",
        help="also score the real training-pool frames (a fit figure)",
    )
    a = ap.parse_args(argv)
    roles = (VALIDATION, TRAIN) if a.training_frames else (VALIDATION,)
    try:
        frames = real_frames(Path(a.real_dir), roles)
    except ValueError as e:  # a folder of one's own scans without (or with a bad) roles.json
        ap.error(str(e))
    missing = [f for p in frames for f in (p, p.with_suffix(".label")) if not f.is_file()]
    if missing:  # before minutes of scoring synthetic frames
        ap.error(f"{len(missing)} real frame files missing, first {missing[0]} (--real-dir)")
    pipeline = build_pipeline(a.weights, a.device)
    names, voxel = pipeline.meta["class_names"], pipeline.voxel_config.voxel_size
    heldout = evaluate_heldout(pipeline, names, max(a.frames, 1))
    result = {
        "weights": a.weights,
        "voxel_size": voxel,
        "heldout_synthetic": heldout,
        # the fixed frame is the first held-out frame: its mIoU is already there
        "fixed_frame": {"seed": FIXED_FRAME_SEED, "miou": heldout["frame_miou"][0]},
        "real_semantickitti": evaluate_real(pipeline, names, Path(a.real_dir), roles),
    }
    text = json.dumps(result, indent=1)
    print(text)
    if a.json:
        Path(a.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
