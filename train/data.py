"""Training batches from synthetic frames (synth/), voxelized like the pipeline does.

Seed ranges (documented, disjoint):
  * training frames:  seeds 0 .. num_train_seeds - 1   (TRAIN_SEED_START = 0)
  * held-out frames:  seeds from HELDOUT_SEED_START = 1_000_000 onward (validation only; never
    drawn by the training iterator)
Real frames: only training-pool frames of train/real.py's ROLES table (MixedBatches refuses a
validation frame); the validation frames are scored by train/validate.py, never trained on.

Batch `step` is a pure function of (seed, step): which frames, which subsample, which
augmentation. So resuming at step k reproduces the batches of an uninterrupted run exactly.
Synthetic intensities are already in 0..1, so frames are voxelized with the "kitti" scale.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from app.inference.voxel_config import VoxelizeConfig
from app.inference.voxelize import voxelize
from models.labels import IGNORE_LABEL as IGNORE
from models.labels import NUM_CLASSES
from synth.generate import generate_frame
from synth.sensor import PROFILES

from .augment import (
    REAL_AUGMENT,
    AugmentConfig,
    augment,
    paste_instances,
    sector_crop,
    swap_sector,
)
from .real import REAL_DIR, GROUND_CLASSES, check_training_frames, instance_bank, load_real

TRAIN_SEED_START = 0
HELDOUT_SEED_START = 1_000_000


def train_seeds(n: int) -> range:
    if not 0 < n <= HELDOUT_SEED_START:
        raise ValueError(f"need 0 < num_train_seeds <= {HELDOUT_SEED_START}, got {n}")
    return range(TRAIN_SEED_START, TRAIN_SEED_START + n)


def heldout_seeds(n: int) -> range:
    return range(HELDOUT_SEED_START, HELDOUT_SEED_START + n)


@functools.lru_cache(maxsize=256)  # ~0.6 GB: a run with --train-seeds 256 generates each once
def synthetic_frame(seed: int, profile: str = "hdl64") -> tuple[np.ndarray, np.ndarray]:
    """(points float32 [N, 4], labels uint8 [N]) for one synthetic scan (cached, read-only), its
    intensity on KITTI's 0..1 whatever the profile writes (nuscenes32 and ouster128 write 0..255,
    which training read as 0..1 and clipped to 1 everywhere)."""
    scan = PROFILES[profile]
    frame = generate_frame(int(seed), scan)
    points, labels = frame.points, frame.labels
    if scan.intensity_scale != 1.0:
        points = points.copy()
        points[:, 3] /= np.float32(scan.intensity_scale)
    points.flags.writeable = False
    labels.flags.writeable = False
    return points, labels


@dataclass
class TrainBatch:
    coords: torch.Tensor  # int32 [M, 4] (batch, x, y, z)
    feats: torch.Tensor  # float32 [M, 4]
    labels: torch.Tensor  # int64 [M]: majority class of the voxel's points, 255 = none
    seeds: list  # synthetic seeds or frame names, one per batch item


def voxel_labels(
    point_to_voxel: torch.Tensor,
    point_labels: torch.Tensor,
    num_voxels: int,
    num_classes: int = NUM_CLASSES,
    ignore: int = IGNORE,
) -> torch.Tensor:
    """int64 [num_voxels]: the majority label of each voxel's points (ties: the smaller class id),
    from one torch.bincount over voxel * num_classes + class; points that are dropped
    (point_to_voxel < 0) or labelled `ignore` do not vote; a voxel without votes gets `ignore`."""
    point_labels = point_labels.to(torch.int64)
    vote = (point_to_voxel >= 0) & (point_labels != ignore) & (point_labels < num_classes)
    keys = point_to_voxel[vote] * num_classes + point_labels[vote]
    counts = torch.bincount(keys, minlength=num_voxels * num_classes)
    counts = counts.view(num_voxels, num_classes)
    out = counts.argmax(dim=1)
    out[counts.sum(dim=1) == 0] = ignore
    return out


def make_batch(
    frames: list[tuple[np.ndarray, np.ndarray]],
    config: VoxelizeConfig,
    seeds: list[int] | None = None,
) -> TrainBatch:
    """Voxelizes several (points, labels) frames as one batch (batch index = list position)."""
    vb = voxelize([p for p, _ in frames], config, "kitti")
    num_voxels = len(vb.coords)
    mapping = torch.cat(vb.point_to_voxel)
    labels = torch.from_numpy(np.concatenate([np.asarray(lab, np.int64) for _, lab in frames]))
    return TrainBatch(
        vb.coords, vb.feats, voxel_labels(mapping, labels, num_voxels), list(seeds or [])
    )


class SyntheticBatches:
    """batches[step] (or iteration from `start`): `batch_size` training frames per batch."""

    def __init__(
        self,
        seeds,
        batch_size: int = 2,
        seed: int = 0,
        max_points: int | None = None,
        voxel_config: VoxelizeConfig = VoxelizeConfig(),
        profile: str = "hdl64",
        augment_config: AugmentConfig | None = AugmentConfig(),
    ):
        self.seeds = list(seeds)
        if not self.seeds or any(s >= HELDOUT_SEED_START for s in self.seeds):
            raise ValueError(f"training seeds must be non-empty and < {HELDOUT_SEED_START}")
        self.batch_size, self.seed, self.max_points = int(batch_size), int(seed), max_points
        self.voxel_config, self.profile, self.augment_config = voxel_config, profile, augment_config

    def __getitem__(self, step: int) -> TrainBatch:
        rng = np.random.default_rng([self.seed, int(step), 0xDA7A])
        picks = [self.seeds[i] for i in rng.integers(0, len(self.seeds), self.batch_size)]
        frames = []
        for s in picks:
            points, labels = synthetic_frame(s, self.profile)
            if self.max_points and len(points) > self.max_points:
                idx = np.sort(rng.choice(len(points), self.max_points, replace=False))
                points, labels = points[idx], labels[idx]
            if self.augment_config is not None:
                points, labels = augment(points, labels, rng, self.augment_config)
            frames.append((points, labels))
        return make_batch(frames, self.voxel_config, picks)

    def iterate(self, start: int = 0, stop: int | None = None):
        step = start
        while stop is None or step < stop:
            yield self[step]
            step += 1

    def __iter__(self):
        return self.iterate()


class MixedBatches(SyntheticBatches):
    """Batches mixing real training-pool frames (train/real.py) and synthetic frames: each of the
    `batch_size` slots is a real frame with probability `real_share`, else a synthetic one.
    With crop_degrees < 360 every frame is first cut to one random azimuth wedge that wide
    (augment.sector_crop: cheaper steps). With probability `scene_mix` a real frame first has
    half of its sweep replaced by the same half of another real training frame
    (augment.swap_sector). Every frame then gets up to `paste` thing instances cut
    from the other real training frames (augment.paste_instances), then the augmentations
    (REAL_AUGMENT for real frames). Still a pure function of (seed, step). `seeds` are the
    synthetic training seeds."""

    def __init__(
        self,
        real_frames,
        seeds,
        real_share: float = 0.75,
        paste: int = 4,
        real_augment: AugmentConfig | None = REAL_AUGMENT,
        crop_degrees: float = 360.0,
        scene_mix: float = 0.0,
        real_dir: str = str(REAL_DIR),
        **kw,
    ):
        super().__init__(seeds, **kw)
        self.crop_degrees, self.scene_mix = float(crop_degrees), float(scene_mix)
        self.real_dir = str(real_dir)
        self.real_frames = check_training_frames(real_frames, self.real_dir)
        if not self.real_frames and real_share > 0:
            raise ValueError("real_share > 0 needs at least one real training frame")
        self.real_share, self.paste, self.real_augment = float(real_share), int(paste), real_augment
        self.bank = (
            instance_bank(self.real_frames, self.real_dir) if self.real_frames and paste > 0 else ()
        )

    def frame(
        self, rng: np.random.Generator
    ) -> tuple[tuple, np.ndarray, np.ndarray, AugmentConfig]:
        """(the sources of the sample: frame names or synth:SEED, points, labels, augmentation)."""
        if rng.random() < self.real_share:
            name = self.real_frames[rng.integers(0, len(self.real_frames))]
            points, labels, _ = load_real(name, self.real_dir)
            others = [n for n in self.real_frames if n != name]
            if others and self.scene_mix > 0 and rng.random() < self.scene_mix:
                other = others[rng.integers(0, len(others))]
                other_frame = load_real(other, self.real_dir)
                points, labels = swap_sector(points, labels, *other_frame[:2], rng)
                return (name, other), points, labels, self.real_augment
            return (name,), points, labels, self.real_augment
        seed = self.seeds[rng.integers(0, len(self.seeds))]
        points, labels = synthetic_frame(seed, self.profile)
        return (f"synth:{seed}",), points, labels, self.augment_config

    def __getitem__(self, step: int) -> TrainBatch:
        rng = np.random.default_rng([self.seed, int(step), 0x4EA1])
        frames, names = [], []
        for _ in range(self.batch_size):
            sources, points, labels, config = self.frame(rng)
            if self.max_points and len(points) > self.max_points:
                idx = np.sort(rng.choice(len(points), self.max_points, replace=False))
                points, labels = points[idx], labels[idx]
            if self.crop_degrees < 360:
                points, labels = sector_crop(points, labels, rng, self.crop_degrees)
            points, labels = paste_instances(
                points, labels, rng, self.bank, self.paste, GROUND_CLASSES, sources
            )
            if config is not None:
                points, labels = augment(points, labels, rng, config)
            frames.append((points, labels))
            names.append("+".join(sources))
        return make_batch(frames, self.voxel_config, names)
