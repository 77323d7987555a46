"""Points -> voxels with Open3D's tensor HashSet (its HashMap without values), and back.

One kernel pass over the points (kernels/voxel.py) checks them, packs their cells into 64-bit
keys, collapses runs of equal keys (consecutive LiDAR points often share a voxel) and gives each
run its block of voxels; Open3D's hash set finds the occupied blocks (about 3.2 m wide) and
bitmaps in each block the distinct keys among the runs, read off in order; a last kernel
pass sums the voxels' features in point order and divides them.

Every input point is accounted for: a point is either in a voxel or ignored (non-finite, or
outside the configured range) and counted as such. Voxels are in ascending (batch, x, y, z)
order, so the same frame always gives the same voxels in the same order, whatever order Open3D's
parallel insert visits them in; it is also the order in which kernel maps build fastest (merge
joins instead of hash probes, kernels/csrc/sorted_kmap_cpu.cpp), and downsampling keeps it.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from dataclasses import dataclass
from types import ModuleType

import numpy as np
import torch

from kernels import voxel as voxel_kernels
from models.checkpoint_meta import (
    DEFAULT_VOXEL_SIZE,
    INPUT_FEATURES,
    INTENSITY_NORMALISATION,
    intensity_scales,
)
from models.labels import IGNORE_LABEL

# Open3D's CPU hash set (oneTBB) on one thread: for a KITTI frame's 66,060 run keys two threads
# were about 2x slower (they contend on the shared table). With 17,409 block-run keys, two threads
# made the table itself faster (1.28 -> 1.0 ms) but the voxelize stage slower (7.1 -> 8.0 ms,
# paired runs on the 2-core AMD EPYC; 6.0 -> 6.9 ms on the Intel Xeon with 6,503 keys): its
# threads then compete with ours. It is the only Open3D call in the process; the limit is
# process-wide.
OPEN3D_THREADS = 1

o3c: ModuleType | None
OPEN3D_ERROR: str | None = None  # why Open3D did not load, where it did not
try:  # Open3D is the voxelizer; hosts without it (a bare GPU box) fall back to torch.unique
    import open3d
    import open3d.core as o3c

    if hasattr(open3d.utility, "set_max_threads"):  # Open3D >= 0.20; older ones use every core
        open3d.utility.set_max_threads(OPEN3D_THREADS)
except ImportError as error:  # pragma: no cover - exercised only where Open3D does not load
    o3c = None
    OPEN3D_ERROR = str(error)
    if importlib.util.find_spec("open3d") is not None:  # installed, but a library is missing
        logging.getLogger(__name__).warning(
            "Open3D is installed but does not load (%s): voxelizing with torch.unique instead, "
            "75x slower. On Debian: apt-get install libegl1 libgl1 libgomp1 libusb-1.0-0",
            error,
        )


def voxelizer() -> str:
    """Which voxelizer runs (/v1/model): "open3d", or "torch.unique" where Open3D did not load
    (OPEN3D_ERROR says why)."""
    return "open3d" if o3c is not None else "torch.unique"


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
    counterpart of the kernel's sums; both take the columns from _feature_columns)."""
    if points.ndim != 2 or points.shape[1] < 3:
        raise ValueError(f"points must be [N, >=3], got {points.shape}")
    columns, scales = _feature_columns(points, config, sensor)
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


def voxelize(
    frames: list[np.ndarray],
    config: VoxelizeConfig,
    sensor: str | list[str] = "kitti",
    device: torch.device = torch.device("cpu"),
    valid: list[Valid | None] | None = None,
) -> VoxelBatch:
    """Voxelize several frames as one batch (batch index = position in `frames`); `sensor` is one
    name for all frames or one per frame (it sets the intensity scale). `valid`: per frame the
    valid_mask result the caller already has; the kernel pass finds the same points itself, so
    only the fallback (no Open3D, or a grid beyond 17 bits per axis) uses it."""
    sensors = per_frame(sensor, len(frames))
    known: list[Valid | None] = list(valid) if valid is not None else [None] * len(frames)
    if len(known) != len(frames):
        raise ValueError(f"{len(frames)} frames but {len(known)} validity masks")
    grid = voxel_grid(config, len(frames))
    if o3c is None or grid is None:
        return _voxelize_by_sorting(frames, config, sensors, device, known)
    keys: list[voxel_kernels.FrameKeys] = []
    first_run = first_row = 0
    for b, points in enumerate(frames):
        frame_keys = voxel_kernels.voxel_keys(
            points, config.voxel_size, config.max_xy, config.z_range, grid, b, first_run, first_row
        )
        keys.append(frame_keys)
        first_run += len(frame_keys.run_keys)
        first_row += len(frame_keys.blocks.words)
    run_keys, blocks = _batch_runs(keys, grid)
    voxel_of_run, coords = _distinct_in_order(run_keys, blocks, grid)
    # the sums pass clears these (the first frame) and writes the means (the last)
    num_features = len(config.features)
    sums = torch.empty((len(coords), num_features), dtype=torch.float64)
    counts = torch.empty(len(coords), dtype=torch.int64)
    feats = torch.empty((len(coords), num_features), dtype=torch.float32)
    point_to_voxel = []
    for b, (points, frame_keys, frame_sensor) in enumerate(zip(frames, keys, sensors)):
        columns, scales = _feature_columns(points, config, frame_sensor)
        mapping = voxel_kernels.voxel_sums(
            points,
            columns,
            scales,
            frame_keys.run_of_point,
            voxel_of_run,
            sums,
            counts,
            clear=b == 0,
            means=feats if b == len(frames) - 1 else None,  # float64 means rounded once
        )
        point_to_voxel.append(torch.from_numpy(mapping))
    ignored = [{"non_finite": k.non_finite, "out_of_range": k.out_of_range} for k in keys]
    return VoxelBatch(
        torch.from_numpy(coords).to(device), feats.to(device), point_to_voxel, ignored
    )


@functools.lru_cache(maxsize=64)
def voxel_grid(config: VoxelizeConfig, batches: int = 1) -> voxel_kernels.Grid | None:
    """The cells a kept point can fall in (float32 arithmetic, as the kernel's): the lowest of
    each axis and how many; None when that spans 2^17 cells or more on some axis, or the batch
    has more than 2^12 frames (the packed keys' fields)."""
    voxel = np.float32(config.voxel_size)
    lo = np.array([-config.max_xy, -config.max_xy, config.z_range[0]], np.float32) / voxel
    hi = np.array([config.max_xy, config.max_xy, config.z_range[1]], np.float32) / voxel
    lo, hi = np.floor(lo), np.floor(hi)
    if not (np.isfinite(lo).all() and np.isfinite(hi).all()) or np.abs(lo).max() >= 2**30:
        return None
    if (hi - lo).max() >= 2**voxel_kernels.AXIS_BITS or batches > 2**voxel_kernels.BATCH_BITS:
        return None
    origin = tuple(int(v) for v in lo)
    span = tuple(int(v) + 1 for v in hi - lo)
    shift = voxel_kernels.block_shift(config.voxel_size)
    return voxel_kernels.Grid(origin, span, batches, shift)  # type: ignore[arg-type]


def _feature_columns(
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


def _batch_runs(
    keys: list[voxel_kernels.FrameKeys], grid: voxel_kernels.Grid
) -> tuple[np.ndarray, voxel_kernels.BlockKeys]:
    """The runs and block rows of a batch's frames, one after the other (a single frame's as they
    are: no copy)."""
    if len(keys) == 1:
        return keys[0].run_keys, keys[0].blocks
    if not keys:
        empty = np.zeros((0, grid.words), np.int32)
        return np.zeros(0, np.int64), voxel_kernels.BlockKeys(
            empty, np.zeros(0, np.int32), grid.shift
        )
    run_keys = np.concatenate([k.run_keys for k in keys])
    words = np.concatenate([k.blocks.words for k in keys])
    block_run = np.concatenate([k.blocks.block_run for k in keys])
    return run_keys, voxel_kernels.BlockKeys(words, block_run, grid.shift)


def _distinct_in_order(
    run_keys: np.ndarray, blocks: voxel_kernels.BlockKeys, grid: voxel_kernels.Grid
) -> tuple[np.ndarray, np.ndarray]:
    """(voxel id of every run, int32 [M, 4] distinct (batch, x, y, z) in ascending order) for the
    runs' packed keys and the rows of their blocks.

    Two levels, as Open3D's VoxelBlockGrid hashes blocks of voxels: Open3D's tensor hash set
    holds the occupied blocks, about 3.2 m wide (kernels/voxel.py block_shift: 32^3 cells at
    0.1 m, 64^3 at 0.05 m), and gives each a slot; bitmaps of 8^3 cells, made for the 8^3 parts
    of a slot's block that have voxels, mark each run's cell; the kernel reads the distinct keys
    off them in order (only the bitmaps' rows that hold voxels are sorted). Open3D's CPU table
    costs about 130-150 ns a key: a KITTI frame at 0.1 m has 60,152 voxels but 791 blocks; the
    keys pass gives it one key per run of points in one block, and none for a block given out
    lately (938 keys instead of 66,060 runs), and only the copies that insert() did not place
    are looked up again.
    Blocks of 8^3 (6,503 keys) took the table 1.2 ms on the Intel Xeon, 16^3 0.5 ms, 32^3 0.2 ms
    (the stage 5.7 -> 5.1 ms from 8^3 to 16^3, and for the sparser nuScenes frame 3.3 -> 2.9;
    from 16^3 to 32^3 nuScenes at 0.05 m 2.37 -> 2.18 ms, Ouster at 0.05 m 6.0 -> 5.4 ms). At
    0.1 m, blocks of 64^3 would leave the table 430-527 keys; at 0.05 m they leave it as many as
    32^3 at 0.1 m (nuScenes 1,051, Ouster 1,304) and took nuScenes' stage from x2.36 to x2.03
    of the numpy floor (Intel Xeon, bench.voxelize)."""
    assert o3c is not None  # voxelize() takes the sorting fallback without Open3D
    if len(run_keys) == 0:
        return np.zeros(0, np.int32), np.zeros((0, 4), np.int32)
    words = blocks.words
    keys = o3c.Tensor.from_numpy(words)  # shares the array: no copy
    table = o3c.HashSet(len(words), key_dtype=o3c.int32, key_element_shape=(words.shape[1],))
    inserted, new = table.insert(keys)
    slots, new = inserted.numpy(), new.numpy()
    if not new.all():  # a block given twice: its later copies find the slot of the first
        again = np.flatnonzero(~new)
        found_slots, found = table.find(o3c.Tensor.from_numpy(words[again]))
        if not found.numpy().all():  # pragma: no cover - Open3D lost a key it just inserted
            raise RuntimeError("Open3D's hash set did not find every block it was given")
        slots = slots.copy()
        slots[again] = found_slots.numpy()
    num_slots = table.capacity()
    # Open3D's table goes before the ordering pass (its memory crowds the caches the pass needs)
    del table, inserted
    return voxel_kernels.voxel_order(run_keys, blocks, slots, num_slots, grid.origin)


def _voxelize_by_sorting(
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


def devoxelize(
    voxel_labels: torch.Tensor, point_to_voxel: torch.Tensor, ignore_label: int = IGNORE_LABEL
) -> np.ndarray:
    """Per-point labels (uint8) from per-voxel labels; ignored points (voxel -1) get
    ignore_label: one gather from the labels with ignore_label appended, where -1 lands."""
    table = np.append(voxel_labels.cpu().numpy().astype(np.uint8), np.uint8(ignore_label))
    return table[point_to_voxel.numpy()]
