"""What voxelize (app/inference/voxelize.py) is given and gives back: its configuration
(VoxelizeConfig), its result (VoxelBatch), and the per-point rules a configuration sets: which
points are kept (valid_mask, checked_points: the kernel pass's rule) and their input features
(point_features, feature_columns), with a sensor's intensity scale.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from kernels import voxel as voxel_kernels
from models.checkpoint_meta import (
    DEFAULT_VOXEL_SIZE,
    INPUT_FEATURES,
    INTENSITY_NORMALISATION,
    intensity_scales,
)

# sensor -> intensity factor of our checkpoint format's default normalisation
INTENSITY_SCALE = intensity_scales(INTENSITY_NORMALISATION)
FEATURE_COLUMNS = {"x": 0, "y": 1, "z": 2, "intensity": 3}


@dataclass(frozen=True)
class VoxelizeConfig:
    voxel_size: float = DEFAULT_VOXEL_SIZE
    features: tuple[str, ...] = INPUT_FEATURES
    max_xy: float = 120.0  # metres from the sensor, per axis
    z_range: tuple[float, float] = (-20.0, 20.0)
    # (sensor, factor) pairs: intensity * factor is the feature (a checkpoint's
    # intensity_normalisation, app/inference/builder.py); sensors not listed use 1.0
    intensity_scale: tuple[tuple[str, float], ...] = tuple(INTENSITY_SCALE.items())

    def __post_init__(self):
        if self.voxel_size <= 0:
            raise ValueError(f"voxel_size must be positive, got {self.voxel_size}")
        unknown = set(self.features) - set(FEATURE_COLUMNS)
        if unknown:
            raise ValueError(
                f"unknown input features {sorted(unknown)}; known: {list(FEATURE_COLUMNS)}"
            )


@dataclass
class VoxelBatch:
    coords: torch.Tensor  # int32 [M, 4] (batch, x, y, z)
    feats: torch.Tensor  # float32 [M, F]: mean of the voxel's point features
    point_to_voxel: list[torch.Tensor]  # per frame, int64 [N_i]: voxel row, -1 if ignored
    ignored: list[dict[str, int]]  # per frame: {"non_finite": .., "out_of_range": ..}


def point_features(points: np.ndarray, config: VoxelizeConfig, sensor: str) -> np.ndarray:
    """[N, F] float32 input features, intensity scaled for the sensor (the sorting fallback's
    counterpart of the kernel's sums; both take the columns from feature_columns)."""
    if points.ndim != 2 or points.shape[1] < 3:
        raise ValueError(f"points must be [N, >=3], got {points.shape}")
    columns, scales = feature_columns(points, config, sensor)
    out = np.zeros((len(points), len(columns)), np.float32)
    for j, (col, scale) in enumerate(zip(columns, scales)):
        if col >= 0:  # -1: xyz-only input, a constant intensity of 0
            out[:, j] = points[:, col].astype(np.float32) * np.float32(scale)
    return out


def valid_mask(points: np.ndarray, config: VoxelizeConfig) -> Valid:
    """(keep mask, ignored counts): kept are points with finite x, y, z inside the configured
    range, by the rule the voxelizer's kernel pass applies (float32 comparisons)."""
    return checked_points(points, config)[0]


def checked_points(
    points: np.ndarray, config: VoxelizeConfig, extras_top: float = float("inf")
) -> tuple[Valid, int]:
    """valid_mask's result and, from the same pass, how many rows have columns after x, y, z
    to clean: an intensity (column 3) outside 0 .. extras_top or NaN, a later column not finite."""
    if points.ndim != 2 or points.shape[1] < 3:
        raise ValueError(f"points must be [N, >=3], got {points.shape}")
    keep, non_finite, out_of_range, unclean = voxel_kernels.valid_points(
        points, config.max_xy, config.z_range, extras_top
    )
    return (keep, {"non_finite": non_finite, "out_of_range": out_of_range}), unclean


Valid = tuple[np.ndarray, dict[str, int]]  # valid_mask's (keep mask, ignored counts)


def per_frame(sensor: str | list[str], frames: int) -> list[str]:
    """One sensor name per frame from one name for all or a list of them (checked)."""
    sensors = [sensor] * frames if isinstance(sensor, str) else list(sensor)
    if len(sensors) != frames:
        raise ValueError(f"{frames} frames but {len(sensors)} sensor names")
    return sensors


def feature_columns(
    points: np.ndarray, config: VoxelizeConfig, sensor: str
) -> tuple[list[int], list[float]]:
    """Per input feature: its column in points (-1: a constant 0, intensity of xyz-only input)
    and its float32 factor (the sensor's intensity scale, else 1)."""
    scale = dict(config.intensity_scale).get(sensor, 1.0)
    columns, scales = [], []
    for name in config.features:
        col = FEATURE_COLUMNS[name]
        if col >= points.shape[1]:
            if name != "intensity":
                raise ValueError(
                    f"feature {name!r} needs column {col}, points have {points.shape[1]}"
                )
            col = -1
        columns.append(col)
        scales.append(scale if name == "intensity" else 1.0)
    return columns, scales
