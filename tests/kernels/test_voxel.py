"""The voxelizer's host kernels (kernels/voxel.py) against numpy oracles, bit for bit."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from kernels import voxel
from kernels.backend import KernelError

VOXEL, MAX_XY, Z_RANGE = 0.1, 30.0, (-3.0, 5.0)
ORIGIN = np.floor(np.array([-MAX_XY, -MAX_XY, Z_RANGE[0]], np.float32) / np.float32(VOXEL))


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


# rows of 3 and 4 columns are read in place, 5 (nuScenes) and 6 columns copied into x, y, z first
@pytest.mark.parametrize("seed,columns", [(0, 4), (1, 3), (2, 5), (3, 6)])
def test_keys_runs_and_counts_match_numpy(seed, columns):
    pts = hostile_points(5000, seed)
    pts = np.ascontiguousarray(np.resize(pts.T, (columns, len(pts))).T)  # columns >= 3 repeat
    got = voxel.voxel_keys(pts, VOXEL, MAX_XY, Z_RANGE, ORIGIN.astype(np.int32), batch=3)
    keys, run_of_point, (non_finite, out_of_range), cells = oracle_keys(pts, 3)
    assert np.array_equal(got.run_keys, keys)
    assert np.array_equal(got.run_of_point, run_of_point)
    assert (got.non_finite, got.out_of_range) == (non_finite, out_of_range) and non_finite > 0
    assert got.low.tolist() == cells.min(0).tolist() and got.high.tolist() == cells.max(0).tolist()
    keep, *tallies = voxel.valid_points(pts, MAX_XY, Z_RANGE)
    assert np.array_equal(keep, run_of_point >= 0) and tallies == [non_finite, out_of_range]
    later = voxel.voxel_keys(pts, VOXEL, MAX_XY, Z_RANGE, ORIGIN.astype(np.int32), 3, 100)
    assert np.array_equal(later.run_of_point, np.where(run_of_point < 0, -1, run_of_point + 100))


def test_no_kept_point_and_a_grid_that_does_not_cover_the_range():
    none = voxel.voxel_keys(np.full((4, 3), np.nan, np.float32), VOXEL, MAX_XY, Z_RANGE, ORIGIN)
    assert len(none.run_keys) == 0 and none.non_finite == 4 and none.high.tolist() == [-1] * 3
    pts = np.array([[1.0, 1.0, 1.0], [29.0, 1.0, 1.0]], np.float32)
    with pytest.raises(ValueError, match=r"point 1 \[29.0, 1.0, 1.0\] is outside the grid"):
        voxel.voxel_keys(pts, VOXEL, MAX_XY, Z_RANGE, np.array([100 - 2**17, 0, 0], np.int32))


# three features (xyz-only input: intensity a constant 0), four in place (x, y, z, intensity),
# four elsewhere, five (a count the kernel takes at run time)
@pytest.mark.parametrize("cols", [[3, 0, -1], [0, 1, 2, 3], [3, 2, 1, 0], [0, 1, 2, 3, 3]])
def test_feature_sums_are_bincounts_bit_for_bit(cols):
    rng = np.random.default_rng(0)
    pts = rng.normal(size=(3000, 4)).astype(np.float32)
    ids = rng.integers(-1, 200, 3000)
    scales = [0.25, 1.0, 3.0, 1.0, 0.5][: len(cols)]
    sums = torch.zeros((200, len(cols)), dtype=torch.float64)
    counts = torch.zeros(200, dtype=torch.int64)
    # every point its own run; the runs' voxels in reverse
    mapping = voxel.voxel_sums(pts, cols, scales, ids, 199 - np.arange(200), sums, counts)
    assert np.array_equal(mapping, np.where(ids >= 0, 199 - ids, -1))
    kept = mapping >= 0
    for j, (col, scale) in enumerate(zip(cols, scales)):
        feature = pts[kept, col] * np.float32(scale) if col >= 0 else np.zeros(kept.sum())
        want = np.bincount(mapping[kept], weights=feature, minlength=200)
        assert np.array_equal(sums[:, j].numpy(), want)
    assert np.array_equal(counts.numpy(), np.bincount(mapping[kept], minlength=200))
    one = sums[:, :1].contiguous()
    with pytest.raises(KernelError, match="bad argument"):  # a run beyond the runs
        voxel.voxel_sums(pts, [0], [1.0], np.full(3000, 200), np.arange(200), one, counts)
    with pytest.raises(KernelError, match="bad argument"):  # a voxel beyond the voxels
        voxel.voxel_sums(pts, [0], [1.0], np.zeros(3000), np.full(200, 200), one, counts)
    nine = torch.zeros((200, 9), dtype=torch.float64)
    with pytest.raises(KernelError, match="bad argument"):  # more than 8 features
        voxel.voxel_sums(pts, [0] * 9, [1.0] * 9, ids, np.arange(200), nine, counts)


MASK = (1 << 17) - 1


def block_slots(runs: np.ndarray, blocks: voxel.BlockKeys) -> tuple[np.ndarray, int]:
    """What a hash set gives the block runs: one slot per distinct block, the same for every
    copy of its key (here numbered by numpy's unique rows)."""
    same_words = np.unique(blocks.words, axis=0, return_inverse=True)[1].ravel()
    return same_words.astype(np.int32), int(same_words.max()) + 1


def order(runs: np.ndarray, origin=np.zeros(3, np.int32)) -> tuple[np.ndarray, np.ndarray]:
    """voxel_order of runs as the voxelizer calls it: block keys, then slots for them."""
    fields = np.stack([runs >> (34 - 17 * a) & MASK for a in range(3)], axis=1)
    blocks = voxel.block_keys(runs, fields.min(0), fields.max(0))
    slots, num_slots = block_slots(runs, blocks)
    return voxel.voxel_order(runs, blocks, slots, num_slots, origin)


@given(st.lists(st.integers(0, 2**62), min_size=1, max_size=300), st.integers(0, 3))
@settings(max_examples=60, deadline=None)
def test_order_sorts_any_keys_the_radix_sort_meets(keys, repeat):
    runs = np.array(keys * (repeat + 1), dtype=np.int64)  # up to 62 bits: four 16-bit digits
    runs = runs[np.argsort(runs >> 51, kind="stable")]  # keys ascend by batch, as voxelize's do
    voxel_of_run, coords = order(runs)
    uniq = np.unique(runs)
    assert np.array_equal(voxel_of_run, np.searchsorted(uniq, runs))
    assert np.array_equal(coords[:, 0], (uniq >> 51).astype(np.int32))


def test_order_sorts_tight_fields_and_one_key():
    """Fields spanning a few bits each (one pass) and a single key (no bits at all)."""
    rng = np.random.default_rng(3)
    fields = rng.integers([0, 900, 40, 3], [2, 905, 44, 9], (700, 4))
    fields = fields[np.argsort(fields[:, 0], kind="stable")]
    runs = fields[:, 0] << 51 | fields[:, 1] << 34 | fields[:, 2] << 17 | fields[:, 3]
    voxel_of_run, _ = order(runs)
    assert np.array_equal(voxel_of_run, np.searchsorted(np.unique(runs), runs))
    voxel_of_run, coords = order(np.full(5, 12345, np.int64))
    assert not voxel_of_run.any() and len(coords) == 1


def test_order_gives_sorted_voxels_and_every_runs_row():
    rng = np.random.default_rng(1)
    distinct = rng.choice(2**20, 500, replace=False).astype(np.int64) | (1 << 51)
    runs = rng.choice(distinct, 1200)
    origin = np.array([-5, 10, -20], np.int32)
    voxel_of_run, coords = order(runs, origin)
    uniq = np.unique(runs)
    assert np.array_equal(voxel_of_run, np.searchsorted(uniq, runs))
    fields = [uniq >> 51, (uniq >> 34 & MASK) - 5, (uniq >> 17 & MASK) + 10, (uniq & MASK) - 20]
    assert np.array_equal(coords, np.stack(fields, 1).astype(np.int32))
    blocks = voxel.block_keys(runs, np.zeros(3, np.int64), np.full(3, MASK))
    slots, num_slots = block_slots(runs, blocks)
    with pytest.raises(KernelError, match="bad argument"):  # keys are never negative
        negative = np.where(np.arange(len(runs)) == 3, -1, runs)
        voxel.voxel_order(negative, blocks, slots, num_slots, origin)
    with pytest.raises(KernelError, match="bad argument"):  # a slot beyond the table
        voxel.voxel_order(runs, blocks, slots, num_slots - 1, origin)
    with pytest.raises(KernelError, match="bad argument"):  # a block run beyond the slots
        short = voxel.BlockKeys(blocks.words[:-1], blocks.block_run, blocks.shift)
        voxel.voxel_order(runs, short, slots[:-1], num_slots, origin)
    # two blocks given one slot: the same cell of each would be one voxel
    side = 1 << voxel.BLOCK_SHIFT  # cell (0, 0, 0) of blocks x = 1 and x = 0
    two = np.array([side << 34, 0], np.int64)
    blocks = voxel.block_keys(two, np.zeros(3, np.int64), np.array([side, 0, 0]))
    assert len(blocks.words) == 2
    assert len(order(two)[1]) == 2  # a slot each: two voxels
    with pytest.raises(KernelError, match="bad argument"):
        voxel.voxel_order(two, blocks, np.zeros(2, np.int32), 1, origin)


@pytest.mark.parametrize("shift", sorted({3, 4, voxel.BLOCK_SHIFT}))
@pytest.mark.parametrize("span", [150, 2**17 - 2100])  # one int32 per block key, then two
def test_block_keys_and_voxels_match_numpy(span, shift):
    rng = np.random.default_rng(2)
    fields = rng.integers([100, 2000, 7], [100 + span, 2000 + span, 150], (4000, 3))
    batch = np.sort(rng.integers(0, 3, 4000))
    runs = batch << 51 | fields[:, 0] << 34 | fields[:, 1] << 17 | fields[:, 2]
    runs = runs[np.lexsort([runs])]  # keys ascend by batch, as the voxelizer's do
    runs = np.repeat(runs, rng.integers(1, 3, len(runs)))  # repeated keys
    rng.shuffle(runs[: len(runs) // 2])
    runs[len(runs) // 2 :].sort()
    low, high = fields.min(0), fields.max(0)
    blocks = voxel.block_keys(runs, low, high, shift)
    # the large span: two int32 for batch 2 + x 14 + y 14 + z 5 bits in blocks of 8^3 (16^3:
    # 13 + 13 + 4 bits), one in blocks of 32^3 (12 + 12 + 3)
    words = 1 if span < 2**10 or shift >= 5 else 2
    assert blocks.words.dtype == np.int32 and blocks.words.shape[1] == words
    # rows given out in order, at most one per run of equal consecutive blocks, and a block
    # seen lately (the shuffled half's revisits) takes its earlier row: fewer rows than runs
    # of blocks, exactly one per block where the runs are sorted
    seen = np.maximum.accumulate(blocks.block_run)
    assert blocks.block_run[0] == 0 and set(np.diff(seen)) <= {0, 1}
    assert seen[-1] == len(blocks.words) - 1
    assert (blocks.words[1:] != blocks.words[:-1]).any(axis=1).all()
    words = blocks.words[blocks.block_run]  # each run's block key
    mask = (1 << 17) - 1
    blocks_of_runs = np.stack(
        [runs >> 51] + [(runs >> (34 - 17 * a) & mask) >> shift for a in range(3)], axis=1
    )
    block_runs = 1 + (blocks_of_runs[1:] != blocks_of_runs[:-1]).any(axis=1).sum()
    assert len(blocks.words) < block_runs
    sorted_half = blocks.block_run[len(runs) // 2 :]
    sorted_blocks = np.unique(blocks_of_runs[len(runs) // 2 :], axis=0)
    assert len(np.unique(sorted_half)) == len(sorted_blocks)
    # equal block keys exactly where the blocks are equal: as many distinct (key, block) pairs
    # as distinct keys and as distinct blocks
    same_words = np.unique(words, axis=0, return_inverse=True)[1].ravel()
    same_blocks = np.unique(blocks_of_runs, axis=0, return_inverse=True)[1].ravel()
    pairs = len(np.unique(np.stack([same_words, same_blocks], 1), axis=0))
    assert pairs == same_words.max() + 1 == same_blocks.max() + 1
    # a slot per block run, as a hash set gives them: its block's
    slot_of_block_run = np.zeros(len(blocks.words), np.int32)
    slot_of_block_run[blocks.block_run] = same_blocks
    num_slots = int(same_blocks.max()) + 1
    voxel_of_run, coords = voxel.voxel_order(
        runs, blocks, slot_of_block_run, num_slots, np.zeros(3, np.int32)
    )
    assert np.array_equal(voxel_of_run, np.searchsorted(np.unique(runs), runs))
    assert len(coords) == len(np.unique(runs))
    with pytest.raises(KernelError, match="bad argument"):  # a field below the given lowest
        voxel.block_keys(runs, low + 64, high, shift)


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
    origin = np.array([-400, -400, -300], np.int32)
    old = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            outs.append(voxel.voxel_keys(pts, 0.1, 40.0, (-20.0, 20.0), origin, 1, 7))
            with pytest.raises(ValueError, match="point 70000 "):
                bad = pts.copy()
                bad[[70_000, 90_000], 0] = -39.0  # below the origin given
                shifted = np.array([-300, -400, -300], np.int32)
                voxel.voxel_keys(bad, 0.1, 40.0, (-20.0, 20.0), shifted)
    finally:
        torch.set_num_threads(old)
    for out in outs[1:]:
        assert np.array_equal(out.run_keys, outs[0].run_keys)
        assert np.array_equal(out.run_of_point, outs[0].run_of_point)
        counts = (out.non_finite, out.out_of_range)
        assert counts == (outs[0].non_finite, outs[0].out_of_range) == (1, 5)
        assert np.array_equal(out.low, outs[0].low) and np.array_equal(out.high, outs[0].high)
    assert outs[0].run_of_point[60_003] == -1
    assert len(set(outs[0].run_of_point[59_999:60_010].tolist()) - {-1}) == 1


def test_voxel_sums_and_means_do_not_depend_on_the_thread_count():
    """The sums pass splits the voxels among the threads, each voxel's points still added in
    point order: the sums numpy's bincount makes, bit for bit, on 1, 2 and 3 threads, across the
    frames of a batch; the means are numpy's float64 division rounded once to float32."""
    rng = np.random.default_rng(9)
    pts = rng.normal(0, 50, (90_000, 4)).astype(np.float32)
    voxel_of_point = rng.integers(-1, 5_000, len(pts))  # -1: ignored points
    expected = np.stack(
        [
            np.bincount(
                voxel_of_point[voxel_of_point >= 0],
                weights=pts[voxel_of_point >= 0, j] * np.float32([1, 1, 1, 0.5])[j],
                minlength=5_000,
            )
            for j in range(4)
        ],
        axis=1,
    )
    old = torch.get_num_threads()
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            # leftovers the first frame's call clears; two frames of one batch, the means
            # written by the last
            sums = torch.full((5_000, 4), float("nan"), dtype=torch.float64)
            counts = torch.full((5_000,), 7, dtype=torch.int64)
            means = torch.empty(5_000, 4)
            runs, cols, scales = np.arange(5_000), [0, 1, 2, 3], [1.0, 1.0, 1.0, 0.5]
            first, second = slice(0, 50_000), slice(50_000, None)
            mapping = [
                voxel.voxel_sums(
                    pts[first], cols, scales, voxel_of_point[first], runs, sums, counts, clear=True
                ),
                voxel.voxel_sums(
                    pts[second],
                    cols,
                    scales,
                    voxel_of_point[second],
                    runs,
                    sums,
                    counts,
                    means=means,
                ),
            ]
            assert np.array_equal(np.concatenate(mapping), voxel_of_point)
            assert np.array_equal(sums.numpy(), expected)
            c = np.maximum(counts.numpy(), 1)[:, None]
            assert np.array_equal(means.numpy(), (sums.numpy() / c).astype(np.float32))
    finally:
        torch.set_num_threads(old)
