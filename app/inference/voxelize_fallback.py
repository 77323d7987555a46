"""The voxelizer's fallback (app/inference/voxelize.py takes it without Open3D, or for a grid
beyond the packed keys' range): torch.unique sorts the kept points' cells into voxels.
"""

from __future__ import annotations

import numpy as np
import torch

from app.inference.voxel_config import (
    Valid,
    VoxelBatch,
    VoxelizeConfig,
    point_features,
    valid_mask,
)


def voxelize_by_sorting(
    frames: list[np.ndarray],
    config: VoxelizeConfig,
    sensors: list[str],
    device: torch.device,
    known: list[Valid | None],
) -> VoxelBatch:
    """The fallback without Open3D or beyond the packed keys' range: torch.unique sorts the
    (batch, x, y, z) rows of the kept points and gives every point its voxel."""
    rows, feats, masks, ignored = [], [], [], []
    for b, (points, frame_sensor, given) in enumerate(zip(frames, sensors, known)):
        keep, counts = given if given is not None else valid_mask(points, config)
        ignored.append(counts)
        masks.append(keep)
        kept = points[keep]
        cells = np.floor(kept[:, :3] / np.float32(config.voxel_size)).astype(np.int32)
        rows.append(np.column_stack([np.full(len(cells), b, np.int32), cells]))
        feats.append(point_features(kept, config, frame_sensor))
    if not rows or sum(len(r) for r in rows) == 0:
        coords, inverse = torch.zeros((0, 4), dtype=torch.int32), torch.zeros(0, dtype=torch.int64)
    else:
        # on the target device: a GPU box without Open3D sorts there, not on one CPU thread
        coords, inverse = torch.unique(
            torch.from_numpy(np.concatenate(rows)).to(device), dim=0, return_inverse=True
        )
        inverse = inverse.cpu()
    all_feats = np.concatenate(feats) if feats else np.zeros((0, len(config.features)), np.float32)
    vfeats = _voxel_means(inverse.numpy(), all_feats, len(coords))
    point_to_voxel, start = [], 0
    for mask in masks:
        ids = inverse[start : start + int(mask.sum())]
        start += len(ids)
        mapping = torch.full((len(mask),), -1, dtype=torch.int64)
        mapping[torch.from_numpy(np.flatnonzero(mask))] = ids
        point_to_voxel.append(mapping)
    return VoxelBatch(coords.to(device), vfeats.to(device), point_to_voxel, ignored)


def _voxel_means(voxel_of_point: np.ndarray, feats: np.ndarray, num_voxels: int) -> torch.Tensor:
    """float32 [M, F] mean feature of each voxel's points (sums in float64, in point order)."""
    counts = np.maximum(np.bincount(voxel_of_point, minlength=num_voxels), 1)
    out = np.empty((num_voxels, feats.shape[1]), dtype=np.float32)
    for j in range(feats.shape[1]):
        out[:, j] = np.bincount(voxel_of_point, weights=feats[:, j], minlength=num_voxels) / counts
    return torch.from_numpy(out)
