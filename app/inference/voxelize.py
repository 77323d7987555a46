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

The configuration, the result and the per-point rules (which points are kept, their features)
are in app/inference/voxel_config.py; without Open3D, or for a grid beyond the packed keys'
range, app/inference/voxelize_fallback.py sorts the points' cells with torch.unique instead.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from types import ModuleType

import numpy as np
import torch

from app.inference.voxel_config import (
    Valid,
    VoxelBatch,
    VoxelizeConfig,
    feature_columns,
    per_frame,
)
from app.inference.voxelize_fallback import voxelize_by_sorting
from kernels import voxel as voxel_kernels
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
        return voxelize_by_sorting(frames, config, sensors, device, known)
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
        columns, scales = feature_columns(points, config, frame_sensor)
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


def devoxelize(
    voxel_labels: torch.Tensor, point_to_voxel: torch.Tensor, ignore_label: int = IGNORE_LABEL
) -> np.ndarray:
    """Per-point labels (uint8) from per-voxel labels; ignored points (voxel -1) get
    ignore_label: one gather from the labels with ignore_label appended, where -1 lands."""
    table = np.append(voxel_labels.cpu().numpy().astype(np.uint8), np.uint8(ignore_label))
    return table[point_to_voxel.numpy()]
