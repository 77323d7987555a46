"""A training run's settings, one field per flag of `python -m train.train`; DIR/last.pt keeps
them as a dict, and the checkpoints' meta describes the run from them (train/state.py)."""

from __future__ import annotations

from dataclasses import dataclass

from .losses import check_loss
from .real import REAL_DIR, VALIDATION, check_training_frames, frames_in_role


@dataclass
class TrainConfig:
    out: str
    cr: float = 0.5
    steps: int = 1000
    batch: int = 2
    lr: float = 2e-3
    weight_decay: float = 1e-4
    seed: int = 0
    train_seeds: int = 1000
    max_points: int | None = None
    ckpt_every: int = 100
    stop_at: int | None = None  # stop (after checkpointing) once this many steps are done
    resume: bool = False
    profile: str = "hdl64"
    voxel_size: float = 0.1
    class_weights: str = "sqrt-inv"  # or "none"
    real_frames: tuple[str, ...] = ()  # training-pool frames (train/real.py)
    real_dir: str = str(REAL_DIR)  # their folder: the shared SemanticKITTI one, or a team's own
    real_share: float = 0.0  # probability that a batch slot is a real frame
    paste: int = 0  # instances pasted into each frame (real frames needed)
    init: str | None = None  # checkpoint to start from (fine-tuning)
    val_every: int = 0  # 0: no validation
    crop_degrees: float = 360.0  # < 360: train on one random azimuth wedge of each frame
    scene_mix: float = 0.0  # probability that a real frame takes half its sweep from another
    loss: str = "ce"  # or "ce+lovasz" (train/losses.py)

    def __post_init__(self):
        self.real_frames = check_training_frames(self.real_frames, self.real_dir)
        if self.val_every and not frames_in_role(VALIDATION, self.real_dir):
            raise ValueError(f"--val-every: {self.real_dir} names no validation frame")
        self.loss = check_loss(self.loss)
        if not 0.0 <= self.real_share <= 1.0 or not 0.0 <= self.scene_mix <= 1.0:
            raise ValueError("--real-share and --scene-mix are shares: 0 to 1")
        if not 0.0 < self.crop_degrees <= 360.0:
            raise ValueError("--crop-degrees: a wedge of more than 0 and at most 360 degrees")
        if self.real_frames and self.real_share <= 0 and self.paste <= 0:
            raise ValueError(
                "--real-frames without --real-share or --paste would train on synthetic scans "
                "only: give the share of batch slots the real frames take (e.g. 0.5)"
            )
