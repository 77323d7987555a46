"""A frame's values after x, y, z made usable before inference, the same for every entry point
(the service, the command line, the in-process pipeline): non-finite ones become 0, intensity is
clamped to the sensor's range. Until 2026-12-06 only the service did this, and `python -m app
segment` labelled a KITTI frame with four intensities of 3e38 as mostly motorcyclists."""

from __future__ import annotations

import numpy as np

from app.inference.voxel_config import Valid, VoxelizeConfig, checked_points


def intensity_top(config: VoxelizeConfig, sensor: str) -> np.float32:
    """The top of a sensor's intensity range, 1 (kitti) or 255 (nuscenes, ouster), as the
    model's intensity normalisation scales it to 1."""
    return np.float32(1.0 / dict(config.intensity_scale).get(sensor, 1.0))


def clean_frame(
    points: np.ndarray, config: VoxelizeConfig, sensor: str
) -> tuple[np.ndarray, Valid, int]:
    """(points, valid_mask's result, how many points were cleaned): one validity pass, and a
    copy only where it found a row to clean."""
    top = intensity_top(config, sensor)
    valid, unclean = checked_points(points, config, float(top))
    return (clean_extra_columns(points, top) if unclean else points), valid, unclean


def clean_extra_columns(points: np.ndarray, top: np.float32) -> np.ndarray:
    """Non-finite values after x, y, z become 0; intensity (column 3) is clamped to the
    sensor's range 0..top, 0..1 (kitti) or 0..255 (nuscenes, ouster) under the model's intensity
    normalisation: a frame with absurd values (3e38) is segmented as if they were the range's
    ends. Copies only when something changes."""
    if points.shape[1] <= 3 or len(points) == 0:
        return points
    inten = points[:, 3]  # min / max are NaN when a value is: the comparisons then fail
    in_range = bool(inten.min() >= 0 and inten.max() <= top)
    if in_range and (points.shape[1] == 4 or np.isfinite(points[:, 4:]).all()):
        return points
    points = points.copy()
    np.nan_to_num(points[:, 3:], copy=False, nan=0.0, posinf=0.0, neginf=0.0)
    np.clip(points[:, 3], 0.0, top, out=points[:, 3])
    return points
