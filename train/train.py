"""Train MinkUNet on synthetic frames, real training-pool frames, or a mix (fine-tuning too).

    python -m train.train --out DIR [--cr 0.5] [--steps N] [--batch B] [--lr LR] [--seed S]
                          [--train-seeds N] [--max-points P] [--ckpt-every K] [--resume]
                          [--voxel-size V] [--class-weights sqrt-inv|none]
                          [--real-frames pool|NAME,NAME] [--real-share F] [--paste K]
                          [--init CHECKPOINT] [--val-every K] [--crop-degrees D] [--threads T]
                          [--scene-mix P] [--loss ce|ce+lovasz]
    python -m train.train --out DIR --export PATH [--best]   last.pt's (or best.pt's) weights

AdamW + one-cycle schedule, cross-entropy with ignore_index 255 on voxel labels (the majority
label of each voxel's points; --loss ce+lovasz adds the Lovasz-softmax loss, train/losses.py),
classes weighted by 1/sqrt(frequency) of the training mix (the first CLASS_FREQ_FRAMES
synthetic frames and the real training frames, each weighted by its share of the batches;
clipped to [0.2, 10] x the mean) so rare classes are not drowned by road.
--real-frames takes frames of the training pool only (train/real.py refuses validation frames);
--init starts from a checkpoint's weights (fine-tuning). Every --val-every steps the model is
scored on the validation frames (train/validate.py) and DIR/best.pt (our checkpoint format,
fp32) keeps the best mean mIoU so far; DIR/val.jsonl logs every validation.
Every --ckpt-every steps (and at the end) DIR/last.pt holds the model, optimizer, scheduler,
step, best score and RNG states; --resume continues from it and reproduces the losses of an
uninterrupted run (batches are a pure function of (seed, step), see train/data.py).
At the end DIR/model.pt holds the final weights (fp16, models/checkpoints.py).
One progress line per step: step/total, loss, lr, voxels, steps/s, ETA, last validation mIoU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from models.checkpoint_meta import INPUT_FEATURES
from models.checkpoints import load_checkpoint, save_checkpoint
from models.minkunet import MinkUNet

from .config import TrainConfig
from .data import NUM_CLASSES
from .losses import LOSSES
from .loop import train
from .real import REAL_DIR, TRAIN, frames_in_role
from .state import meta_for
from app.argtypes import non_negative_int, positive_int


def export_last(out: str, path: str, best: bool = False) -> None:
    """Writes the weights of OUT/last.pt (an unfinished run too), or with best=True those of
    OUT/best.pt, as a fp16 checkpoint."""
    if best:
        model, meta = load_checkpoint(Path(out) / "best.pt")
        save_checkpoint(path, model, meta, half=True)
        return
    state = torch.load(Path(out) / "last.pt", map_location="cpu", weights_only=False)
    cfg = TrainConfig(**state["config"])
    # its --init need not exist now
    model = MinkUNet(in_channels=len(INPUT_FEATURES), num_classes=NUM_CLASSES, cr=cfg.cr)
    model.load_state_dict(state["model"])
    model.eval()
    meta = dict(state.get("meta") or meta_for(cfg))
    meta["version"] += f"-at{state['step']}"
    save_checkpoint(path, model, meta, half=True)


def cli_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m train.train",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", required=True)
    p.add_argument("--cr", type=float, default=0.5)
    p.add_argument("--steps", type=positive_int, default=1000)
    p.add_argument("--batch", type=positive_int, default=2)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=non_negative_int, default=0)
    p.add_argument(
        "--train-seeds", type=non_negative_int, default=1000, help="frames: seeds 0..N-1"
    )
    p.add_argument("--max-points", type=positive_int, default=None, help="subsample each frame")
    p.add_argument("--ckpt-every", type=positive_int, default=100)
    p.add_argument("--stop-at", type=positive_int, default=None, help="stop after this many steps")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--export", default=None, help="write DIR/last.pt's weights here and exit")
    p.add_argument("--voxel-size", type=float, default=0.1)
    p.add_argument("--class-weights", choices=("sqrt-inv", "none"), default="sqrt-inv")
    p.add_argument(
        "--real-frames",
        default="",
        help="'pool' (the whole training pool) or comma-separated training-pool frame names",
    )
    p.add_argument(
        "--real-dir",
        default=str(REAL_DIR),
        help="the real frames' folder: the shared SemanticKITTI one (default), or your own "
        "labelled scans (.bin + .label, SemanticKITTI's layout) with a roles.json naming each "
        "frame 'training pool' or 'validation'",
    )
    p.add_argument("--real-share", type=float, default=0.0, help="share of real batch slots")
    p.add_argument(
        "--paste", type=non_negative_int, default=0, help="instances pasted into each frame"
    )
    p.add_argument("--init", default=None, help="start from this checkpoint's weights")
    p.add_argument(
        "--val-every", type=non_negative_int, default=0, help="validate every K steps (0: never)"
    )
    p.add_argument(
        "--crop-degrees",
        type=float,
        default=360.0,
        help="train on one random azimuth wedge this wide of each frame",
    )
    p.add_argument(
        "--scene-mix",
        type=float,
        default=0.0,
        help="probability that a real frame's half sweep comes from another real frame",
    )
    p.add_argument(
        "--loss",
        choices=LOSSES,
        default="ce",
        help="ce: weighted cross-entropy; ce+lovasz: plus the Lovasz-softmax loss",
    )
    p.add_argument("--threads", type=positive_int, default=None, help="torch.set_num_threads")
    p.add_argument("--best", action="store_true", help="--export: DIR/best.pt, not last.pt")
    return p


def config_from(a: argparse.Namespace) -> TrainConfig:
    """The TrainConfig that parsed flags (cli_parser) describe."""
    real = (
        frames_in_role(TRAIN, a.real_dir)
        if a.real_frames == "pool"
        else tuple(n for n in a.real_frames.split(",") if n)
    )
    return TrainConfig(
        out=a.out,
        cr=a.cr,
        steps=a.steps,
        batch=a.batch,
        lr=a.lr,
        seed=a.seed,
        train_seeds=a.train_seeds,
        max_points=a.max_points,
        ckpt_every=a.ckpt_every,
        stop_at=a.stop_at,
        resume=a.resume,
        voxel_size=a.voxel_size,
        class_weights=a.class_weights,
        real_frames=real,
        real_dir=a.real_dir,
        real_share=a.real_share,
        paste=a.paste,
        init=a.init,
        val_every=a.val_every,
        crop_degrees=a.crop_degrees,
        scene_mix=a.scene_mix,
        loss=a.loss,
    )


def main(argv: list[str] | None = None) -> int:
    a = cli_parser().parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    try:
        if a.export:
            export_last(a.out, a.export, a.best)
            return 0
        train(config_from(a), log=lambda s: print(s, flush=True))
    except (OSError, ValueError) as e:  # a folder, a file, a setting: the user's to mend
        print(f"train.train: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
