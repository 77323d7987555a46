"""The voxelizer's host kernels (kernels/voxel.py) against numpy oracles, bit for bit. Here the
keys pass (keys, runs, counts and block rows, for rows of 3 to 6 columns) and the order pass over
the block rows it gives, on any thread count; the order pass alone: test_voxel_order.py, the sums
pass: test_voxel_sums.py."""

import numpy as np
import pytest
import torch

from kernels import voxel
from kernels.backend import KernelError
from tests.kernels.voxel_helpers import blocks_of

VOXEL, MAX_XY, Z_RANGE = 0.1, 30.0, (-3.0, 5.0)
ORIGIN = np.floor(np.array([-MAX_XY, -MAX_XY, Z_RANGE[0]], np.float32) / np.float32(VOXEL))
HIGHEST = np.floor(np.array([MAX_XY, MAX_XY, Z_RANGE[1]], np.float32) / np.float32(VOXEL))
SPAN = tuple(int(v) for v in HIGHEST - ORIGIN + 1)  # (601, 601, 81) cells
GRID = voxel.Grid(tuple(int(v) for v in ORIGIN), SPAN, batches=4)  # type: ignore[arg-type]


def hostile_points(n: int, seed: int) -> np.ndarray:
    """Points with runs of repeated voxels, non-finite values and points out of range."""
    rng = np.random.default_rng(seed)
    pts = rng.uniform(-35, 35, (n, 4)).astype(np.float32)
    pts[:, 2] = rng.uniform(-4, 6, n)
    pts[1::3] = pts[::3][: len(pts[1::3])] + np.float32(0.001)  # mostly the same voxel again
    pts[rng.random(n) < 0.02, rng.integers(0, 3)] = np.nan
    pts[rng.random(n) < 0.01, 2] = np.inf
    return pts


def oracle_keys(points: np.ndarray, batch: int):
    finite = np.isfinite(points[:, :3]).all(axis=1)
    with np.errstate(invalid="ignore"):
        inside = (np.abs(points[:, 0]) <= MAX_XY) & (np.abs(points[:, 1]) <= MAX_XY)
        inside &= (points[:, 2] >= Z_RANGE[0]) & (points[:, 2] <= Z_RANGE[1])
    keep = finite & inside
    cells = np.floor(points[keep, :3] / np.float32(VOXEL)).astype(np.int64) - ORIGIN.astype(int)
    keys = batch << 51 | cells[:, 0] << 34 | cells[:, 1] << 17 | cells[:, 2]
    head = np.ones(len(keys), bool)
    head[1:] = keys[1:] != keys[:-1]
    run_of_point = np.full(len(points), -1, np.int64)
    run_of_point[keep] = np.cumsum(head) - 1
    counts = (int((~finite).sum()), int((finite & ~inside).sum()))
    return keys[head], run_of_point, counts, cells


def check_block_rows(
    got: voxel.FrameKeys, grid: voxel.Grid, first_row: int = 0, one_part: bool = True
) -> None:
    """The block rows of a keys pass against numpy: each run's row holds its block's key (the
    fields packed in the grid's widths), equal rows only for equal blocks, at most one row per
    run of runs in one block; on one thread (one_part) rows given out in order from first_row
    (each part of a parallel pass gives out its own, and a run it shares with the part before
    keeps that part's row)."""
    blocks = got.blocks
    assert blocks.words.dtype == np.int32 and blocks.words.shape[1] == grid.words
    rows = blocks.block_run - first_row
    assert rows.min(initial=0) >= 0 and rows.max(initial=-1) < len(blocks.words)
    _, wb, wx, wy, wz = grid.block_layout.tolist()
    fields = blocks_of(got.run_keys, grid.shift)
    assert (fields[:, 0] >> wb == 0).all() and (fields[:, 1:] >> [wx, wy, wz] == 0).all()
    packed = ((fields[:, 0] << wx | fields[:, 1]) << wy | fields[:, 2]) << wz | fields[:, 3]
    words = blocks.words.astype(np.int64) & 0xFFFFFFFF
    key_of_row = words[:, 0] | (words[:, 1] << 32 if grid.words == 2 else 0)
    assert np.array_equal(key_of_row[rows], packed)
    seen = np.maximum.accumulate(rows)
    assert not one_part or len(rows) == 0 or (rows[0] == 0 and set(np.diff(seen)) <= {0, 1})
    block_runs = 1 + (fields[1:] != fields[:-1]).any(axis=1).sum() if len(fields) else 0
    assert len(blocks.words) <= block_runs


# rows of 3 and 4 columns are read in place, 5 (nuScenes) and 6 columns copied into x, y, z first
@pytest.mark.parametrize("seed,columns", [(0, 4), (1, 3), (2, 5), (3, 6)])
def test_keys_runs_blocks_and_counts_match_numpy(seed, columns):
    pts = hostile_points(5000, seed)
    pts = np.ascontiguousarray(np.resize(pts.T, (columns, len(pts))).T)  # columns >= 3 repeat
    got = voxel.voxel_keys(pts, VOXEL, MAX_XY, Z_RANGE, GRID, batch=3)
    keys, run_of_point, (non_finite, out_of_range), cells = oracle_keys(pts, 3)
    assert np.array_equal(got.run_keys, keys)
    assert np.array_equal(got.run_of_point, run_of_point)
    assert (got.non_finite, got.out_of_range) == (non_finite, out_of_range) and non_finite > 0
    check_block_rows(got, GRID)
    keep, *tallies, unclean = voxel.valid_points(pts, MAX_XY, Z_RANGE, 0.5)
    assert np.array_equal(keep, run_of_point >= 0) and tallies == [non_finite, out_of_range]
    extras = pts[:, 3:]  # intensity within 0 .. 0.5 (NaN is not), the columns after it finite
    in_range = (extras[:, 0] >= 0) & (extras[:, 0] <= 0.5) if columns > 3 else True
    clean = in_range & np.isfinite(extras[:, 1:]).all(axis=1)
    assert unclean == len(pts) - np.count_nonzero(clean) and (columns == 3 or 0 < unclean)
    later = voxel.voxel_keys(pts, VOXEL, MAX_XY, Z_RANGE, GRID, 3, 100, 50)
    assert np.array_equal(later.run_of_point, np.where(run_of_point < 0, -1, run_of_point + 100))
    assert np.array_equal(later.blocks.block_run, got.blocks.block_run + 50)


def test_blocks_are_about_3_metres_wide_within_the_ordering_kernels_range():
    sizes = [1.0, 0.4, 0.2, 0.1, 0.05, 0.02]
    assert [voxel.block_shift(s) for s in sizes] == [3, 3, 4, 5, 6, 6]


def test_no_kept_point_and_a_grid_that_does_not_cover_the_range():
    none = voxel.voxel_keys(np.full((4, 3), np.nan, np.float32), VOXEL, MAX_XY, Z_RANGE, GRID)
    assert len(none.run_keys) == 0 and none.non_finite == 4 and len(none.blocks.words) == 0
    pts = np.array([[1.0, 1.0, 1.0], [29.0, 1.0, 1.0]], np.float32)
    beyond_17_bits = voxel.Grid((100 - 2**17, 0, 0), (2**17, 601, 81))
    with pytest.raises(ValueError, match=r"point 1 \[29.0, 1.0, 1.0\] is outside the grid"):
        voxel.voxel_keys(pts, VOXEL, MAX_XY, Z_RANGE, beyond_17_bits)
    # a span too short for x = 29 m: its block does not fit the block key's x field
    short = voxel.Grid(GRID.origin, (64 * 5, *SPAN[1:]), shift=6)  # cells 0 .. 319 of x
    with pytest.raises(ValueError, match=r"point 1 \[29.0, 1.0, 1.0\] is outside the grid"):
        voxel.voxel_keys(pts, VOXEL, MAX_XY, Z_RANGE, short)
    with pytest.raises(KernelError, match="bad argument"):  # batch 4 of a grid of 4 frames
        voxel.voxel_keys(pts, VOXEL, MAX_XY, Z_RANGE, GRID, batch=4)


@pytest.mark.parametrize("shift", [3, 4, 5, 6])
@pytest.mark.parametrize("span", [150, 2**17 - 2100])  # one int32 per block key, then two
def test_block_rows_and_voxels_match_numpy(span, shift):
    """Three frames of a batch in voxels of 1 m (a cell is the point's integer part), each half
    shuffled (blocks revisited at random) and half sorted (revisited in scan order)."""
    rng = np.random.default_rng(2)
    grid = voxel.Grid((0, 0, 0), (100 + span, 2000 + span, 150), batches=3, shift=shift)
    # the large span: two int32 for batch 2 + x 14 + y 14 + z 5 bits in blocks of 8^3 (16^3:
    # 13 + 13 + 4 bits), one in blocks of 32^3 (12 + 12 + 3)
    assert grid.words == (1 if span < 2**10 or shift >= 5 else 2)
    frames, first_run, first_row = [], 0, 0
    for b in range(3):
        cells = rng.integers([100, 2000, 7], [100 + span, 2000 + span, 150], (1500, 3))
        cells = np.repeat(cells, rng.integers(1, 3, len(cells)), axis=0)  # repeated cells
        half = len(cells) // 2
        rng.shuffle(cells[:half])  # a repeated cell's points apart: its block revisited
        cells[half:] = cells[half:][np.lexsort(cells[half:].T[::-1])]
        pts = (cells + 0.5).astype(np.float32)
        got = voxel.voxel_keys(pts, 1.0, 2.0**17, (0.0, 2.0**17), grid, b, first_run, first_row)
        check_block_rows(got, grid, first_row)
        runs_of_half = np.unique(got.run_of_point[half:]) - first_run
        fields = blocks_of(got.run_keys, shift)
        # a block seen lately takes its earlier row: in the sorted half exactly one row a block,
        # and fewer rows than runs of blocks in the frame
        sorted_rows = got.blocks.block_run[runs_of_half]
        assert len(np.unique(sorted_rows)) == len(np.unique(fields[runs_of_half], axis=0))
        block_runs = 1 + (fields[1:] != fields[:-1]).any(axis=1).sum()
        assert len(got.blocks.words) < block_runs
        frames.append(got)
        first_run += len(got.run_keys)
        first_row += len(got.blocks.words)
    runs = np.concatenate([f.run_keys for f in frames])
    words = np.concatenate([f.blocks.words for f in frames])
    blocks = voxel.BlockKeys(words, np.concatenate([f.blocks.block_run for f in frames]), shift)
    # a slot per block row, as a hash set gives them: one per distinct key
    slots = np.unique(words, axis=0, return_inverse=True)[1].ravel().astype(np.int32)
    voxel_of_run, coords = voxel.voxel_order(
        runs, blocks, slots, int(slots.max()) + 1, np.zeros(3, np.int32)
    )
    assert np.array_equal(voxel_of_run, np.searchsorted(np.unique(runs), runs))
    assert len(coords) == len(np.unique(runs))


def test_voxel_keys_do_not_depend_on_the_thread_count():
    """The keys pass runs in parts on several threads: runs, keys and every point's run are
    those of one thread, also where a run spans two parts or ignored points sit between its
    points, and the first point outside the grid is the one reported."""
    rng = np.random.default_rng(5)
    pts = rng.uniform([-30, -30, -3, 0], [30, 30, 3, 1], (30_000, 4)).astype(np.float32)
    pts = np.repeat(pts, 4, axis=0)
    pts[60_000:60_010] = pts[59_999]  # a run across the middle (two parts on two threads)
    pts[60_003, 0] = np.nan  # an ignored point inside that run
    pts[61_000:61_005, 2] = 50.0  # out of range
    grid = voxel.Grid((-400, -400, -300), (800, 800, 600), batches=2)
    old = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            outs.append(voxel.voxel_keys(pts, 0.1, 40.0, (-20.0, 20.0), grid, 1, 7, 3))
            with pytest.raises(ValueError, match="point 70000 "):
                bad = pts.copy()
                bad[[70_000, 90_000], 0] = -39.0  # below the origin given
                shifted = voxel.Grid((-300, -400, -300), (800, 800, 600))
                voxel.voxel_keys(bad, 0.1, 40.0, (-20.0, 20.0), shifted)
    finally:
        torch.set_num_threads(old)
    check_block_rows(outs[0], grid, first_row=3)
    for out in outs[1:]:
        assert np.array_equal(out.run_keys, outs[0].run_keys)
        assert np.array_equal(out.run_of_point, outs[0].run_of_point)
        counts = (out.non_finite, out.out_of_range)
        assert counts == (outs[0].non_finite, outs[0].out_of_range) == (1, 5)
        # block rows: the same block for every run (a part's first block may take a row of its
        # own, a copy of a key the hash set already has)
        check_block_rows(out, grid, first_row=3, one_part=False)
        words, first = out.blocks.words, outs[0].blocks.words
        assert np.array_equal(words[out.blocks.block_run - 3], first[outs[0].blocks.block_run - 3])
    assert outs[0].run_of_point[60_003] == -1
    assert len(set(outs[0].run_of_point[59_999:60_010].tolist()) - {-1}) == 1
