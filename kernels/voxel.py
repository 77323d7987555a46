"""The voxelizer's per-point passes on the host (csrc/voxel_keys_cpu.cpp, voxel_order_cpu.cpp,
voxel_cpu.cpp): in one pass packed cell keys with their runs and the runs' block keys; the
ordered voxels once Open3D's hash set has given every block a slot (every run's cell marked in
bitmaps, the distinct keys read off them in order, every run's voxel); every point's voxel with
the voxels' feature sums and means (app/inference/voxelize.py). These passes replace a dozen
numpy passes over the points and a hash set entry per voxel.

Keys pack (batch, x, y, z) as batch << 51 | x << 34 | y << 17 | z, each axis taken from the
grid's origin (AXIS_BITS bits per axis, BATCH_BITS for the batch), so ascending keys are
ascending (batch, x, y, z)."""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from kernels import backend
from kernels.hashtable import ERROR_ROW_BITS, new_error_buffer

AXIS_BITS = 17
BATCH_BITS = 12
# The voxelizer's hash set holds blocks of voxels, not voxels, as Open3D's VoxelBlockGrid does
# (its block_resolution): blocks about BLOCK_METRES wide, 2^shift cells per axis
# (block_shift: 32^3 at 0.1 m, 64^3 at 0.05 m). A KITTI frame at 0.1 m has 60,152 voxels in 791
# blocks of 32^3 (2,244 of 16^3, 5,925 of 8^3). Open3D's CPU table costs about 130-150 ns a key,
# so 32^3 beat 16^3 on every real frame at 0.1 m (Intel Xeon, 2026-12-02: voxelize / numpy
# floor KITTI x1.18 -> x1.05), and at 0.05 m 64^3 gives the table about as many keys as 32^3 at
# 0.1 m (nuScenes 1,051 instead of 2,413, Ouster 1,304 instead of 3,317). The ordering kernel
# keeps a bitmap of 8^3 cells (64 bytes) for each 8^3 part of a block that has voxels: at most 64
# bytes a run, plus a mask of its parts per block (8 bytes for 32^3, 64 for 64^3; bounded by the
# grid: the default range, +-120 m by +-20 m, has 73,125 blocks of 32^3 at 0.1 m and 70,313 of
# 64^3 at 0.05 m, at most 4.5 MB of masks if a hostile frame touched them all).
BLOCK_METRES = 3.2
MIN_BLOCK_SHIFT, MAX_BLOCK_SHIFT = 3, 6  # blocks of 8^3 .. 64^3 cells (the ordering kernel's)


def block_shift(voxel_size: float) -> int:
    """log2 of the cells per axis of a block about BLOCK_METRES wide, within the kernel's range."""
    cells = BLOCK_METRES / voxel_size
    return min(max(round(math.log2(cells)), MIN_BLOCK_SHIFT), MAX_BLOCK_SHIFT)


@functools.lru_cache(maxsize=256)
def _constant(dtype: torch.dtype, *values: float) -> torch.Tensor:
    """A small tensor of a kernel's parameters, made once per distinct values (the kernels only
    read it): a frame's passes take the same few (the point rule, the feature columns)."""
    return torch.tensor(values, dtype=dtype)


def _int32(values: np.ndarray) -> torch.Tensor:
    """int32 rows or runs as a contiguous tensor; a wider array is checked, not wrapped."""
    array = np.asarray(values)
    if array.dtype != np.int32 and len(array):
        lo, hi = int(array.min()), int(array.max())
        if lo < -(2**31) or hi >= 2**31:
            raise ValueError(f"indices {lo}..{hi} do not fit int32")
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.int32))


def _read_only_points(points: np.ndarray) -> torch.Tensor:
    """float32 [N, C] points as a tensor sharing their memory; the kernels only read it, so a
    read-only array (a decoded request body) is fine, and torch's warning about it is not."""
    array = np.ascontiguousarray(points, dtype=np.float32)
    if array.flags.writeable:
        return torch.from_numpy(array)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array)


def valid_points(
    points: np.ndarray,
    max_xy: float,
    z_range: tuple[float, float],
    extras_top: float = float("inf"),
) -> tuple[np.ndarray, int, int, int]:
    """(keep mask, non-finite count, out-of-range count, unclean extras count) of float32
    points [N, >=3] by the rule voxel_keys applies (ls_valid_points_cpu); the last counts rows
    whose intensity (column 3) is outside 0 .. extras_top or NaN or whose later columns are not
    all finite."""
    pts = _read_only_points(points)
    keep = torch.empty(len(pts), dtype=torch.uint8)
    counts = torch.zeros(3, dtype=torch.int64)
    params = _constant(torch.float32, 1.0, max_xy, *z_range, extras_top)
    backend.call("valid_points", "cpu", pts, pts.shape[0], pts.shape[1], params, keep, counts)
    non_finite, out_of_range, unclean = counts.tolist()
    return keep.numpy().view(np.bool_), non_finite, out_of_range, unclean


@dataclass(frozen=True)
class Grid:
    """The cells a batch's keys may take: from origin (int, the lowest cell of each axis) span
    cells per axis, for `batches` frames, in blocks of 2^shift cells per axis."""

    origin: tuple[int, int, int]
    span: tuple[int, int, int]
    batches: int = 1
    shift: int = 5  # blocks of 32^3 cells (block_shift at 0.1 m)

    @functools.cached_property
    def block_layout(self) -> torch.Tensor:
        """int32 [5]: the shift, then the bits of a block key's batch, x, y, z: as few as the
        batches and the span need (the default range, +-120 m by +-20 m, at 0.1 m: 0 + 7 + 7 +
        4 bits, one int32 a key)."""
        widths = [max(self.batches - 1, 0).bit_length()]
        widths += [(max(s - 1, 0) >> self.shift).bit_length() for s in self.span]
        return torch.tensor([self.shift, *widths], dtype=torch.int32)

    @functools.cached_property
    def words(self) -> int:
        """int32 words of a block key: one where it fits 31 bits, else two."""
        return 1 if int(self.block_layout[1:].sum()) <= 31 else 2


@dataclass
class BlockKeys:
    words: np.ndarray  # int32 [block rows, 1 or 2]: a key per run of points in one block
    block_run: np.ndarray  # int32 [runs]: the row of each run's block
    shift: int  # blocks of 2^shift cells per axis


@dataclass
class FrameKeys:
    run_keys: np.ndarray  # int64 [runs]: the key of each run of equal consecutive kept points
    run_of_point: np.ndarray  # int32 [N]: first_run + the point's run, -1 for an ignored point
    non_finite: int
    out_of_range: int
    blocks: BlockKeys  # block_run numbered from first_row


def voxel_keys(
    points: np.ndarray,
    voxel_size: float,
    max_xy: float,
    z_range: tuple[float, float],
    grid: Grid,
    batch: int = 0,
    first_run: int = 0,
    first_row: int = 0,
) -> FrameKeys:
    """Validity, cells, keys, runs and the runs' blocks of one frame's float32 points [N, >=3]
    in one pass (see csrc/api.h, ls_voxel_keys_cpu). Each run's block key gets a row, one per
    run of points in one block, and a block given out lately (4,096 recent blocks remembered by
    a hash of their key) takes its earlier row: a KITTI frame at 0.1 m has 66,060 runs and 920
    rows for 791 blocks of 32^3 (2,452 rows for 2,244 blocks of 16^3; 6,503 for 5,925 of 8^3)."""
    pts = _read_only_points(points)
    n, cols = pts.shape
    params = _constant(torch.float32, voxel_size, max_xy, *z_range)
    run_keys = torch.empty(n, dtype=torch.int64)
    run_of_point = torch.empty(n, dtype=torch.int32)
    block_run = torch.empty(n, dtype=torch.int32)
    words = torch.empty((n, grid.words), dtype=torch.int32)
    counts = torch.zeros(4, dtype=torch.int64)
    err = new_error_buffer(torch.device("cpu"))
    try:
        backend.call(
            "voxel_keys",
            "cpu",
            pts,
            n,
            cols,
            params,
            _constant(torch.int32, *grid.origin),
            grid.block_layout,
            batch,
            first_run,
            first_row,
            run_keys,
            run_of_point,
            block_run,
            words,
            counts,
            err,
        )
    except backend.KernelError as e:
        if "out of range" not in str(e):
            raise
        row = int(err) & ((1 << ERROR_ROW_BITS) - 1)
        raise ValueError(f"{e}: point {row} {points[row, :3].tolist()} is outside the grid") from e
    non_finite, out_of_range, runs, rows = counts.tolist()
    blocks = BlockKeys(words[:rows].numpy(), block_run[:runs].numpy(), grid.shift)
    return FrameKeys(
        run_keys[:runs].numpy(), run_of_point.numpy(), non_finite, out_of_range, blocks
    )


def voxel_sums(
    points: np.ndarray,
    feature_cols: list[int],
    feature_scales: list[float],
    run_of_point: np.ndarray,
    voxel_of_run: np.ndarray,
    sums: torch.Tensor,
    counts: torch.Tensor,
    clear: bool = False,
    means: torch.Tensor | None = None,
) -> np.ndarray:
    """Every point's voxel, voxel_of_run[run_of_point] (-1 for an ignored point's run of -1), as
    int64 [N]; adds one frame's point features to float64 sums [M, F] and point counts int64 [M]
    (set to 0 first if `clear`: a batch's first frame), in point order (ls_voxel_sums_cpu);
    feature j is points[:, feature_cols[j]] * feature_scales[j] in float32, 0 for a column of
    -1. `means` (float32 [M, F], a batch's last frame): the float64 sums / max(counts, 1),
    rounded once to float32, as numpy's division then astype gives them."""
    pts = _read_only_points(points)
    n, cols = pts.shape
    voxel_of_point = torch.empty(n, dtype=torch.int64)
    backend.call(
        "voxel_sums",
        "cpu",
        pts,
        n,
        cols,
        _constant(torch.int32, *feature_cols),
        _constant(torch.float32, *feature_scales),
        len(feature_cols),
        _int32(run_of_point),
        _int32(voxel_of_run),
        len(voxel_of_run),
        len(sums),
        int(clear),
        voxel_of_point,
        sums,
        counts,
        means,
    )
    return voxel_of_point.numpy()


def voxel_order(
    run_keys: np.ndarray,
    blocks: BlockKeys,
    block_slot: np.ndarray,
    num_slots: int,
    origin: Sequence[int],
) -> tuple[np.ndarray, np.ndarray]:
    """(int32 voxel row of every run, int32 [M, 4] distinct (batch, x, y, z) ascending) once a
    hash set has given each block row a slot (block_slot, one per blocks.words row, among
    num_slots): ls_voxel_order_cpu marks every run's cell in bitmaps of 8^3 cells, made for the
    8^3 parts of a slot's block that have voxels (a mask of them per slot up to the highest
    used: Open3D's slots are a dense prefix, one per block), sorts only the bitmaps' 64-bit
    rows of 8 x 8 cells that hold voxels (a KITTI frame's 60,152 voxels lie in 20,479) and
    reads the voxels off them in order; each run takes the row left at its bit's place among
    the set bits."""
    runs = len(run_keys)
    voxel_of_run = torch.empty(runs, dtype=torch.int32)
    coords = torch.empty((runs, 4), dtype=torch.int32)
    num_voxels = torch.zeros(1, dtype=torch.int64)
    backend.call(
        "voxel_order",
        "cpu",
        torch.from_numpy(np.ascontiguousarray(run_keys, dtype=np.int64)),
        runs,
        torch.from_numpy(np.ascontiguousarray(blocks.block_run, dtype=np.int32)),
        torch.from_numpy(np.ascontiguousarray(block_slot, dtype=np.int32)),
        len(blocks.words),
        num_slots,
        blocks.shift,
        _constant(torch.int32, *(int(v) for v in origin)),
        voxel_of_run,
        coords,
        num_voxels,
    )
    return voxel_of_run.numpy(), coords[: int(num_voxels)].numpy()
