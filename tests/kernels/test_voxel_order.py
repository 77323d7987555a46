"""The voxelizer's order pass (kernels/voxel.py voxel_order) against numpy oracles, bit for bit:
voxels sorted from block rows as numpy makes them, and every run's row; on any thread count."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from kernels import voxel
from kernels.backend import KernelError
from tests.kernels.voxel_helpers import MASK, blocks_of


def numpy_blocks(runs: np.ndarray, shift: int = 5):
    """Block rows as numpy makes them (a row per run, its key the block's number among the
    distinct blocks) and the slots a hash set would give them: (BlockKeys, slots, num_slots)."""
    number = np.unique(blocks_of(runs, shift), axis=0, return_inverse=True)[1].ravel()
    blocks = voxel.BlockKeys(
        number.astype(np.int32)[:, None], np.arange(len(runs), dtype=np.int32), shift
    )
    return blocks, number.astype(np.int32), int(number.max(initial=-1)) + 1


def order(runs: np.ndarray, origin=np.zeros(3, np.int32)) -> tuple[np.ndarray, np.ndarray]:
    """voxel_order of runs as the voxelizer calls it: block rows, then slots for them."""
    blocks, slots, num_slots = numpy_blocks(runs)
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
    blocks, slots, num_slots = numpy_blocks(runs)
    with pytest.raises(KernelError, match="bad argument"):  # keys are never negative
        negative = np.where(np.arange(len(runs)) == 3, -1, runs)
        voxel.voxel_order(negative, blocks, slots, num_slots, origin)
    with pytest.raises(KernelError, match="bad argument"):  # a slot beyond the table
        voxel.voxel_order(runs, blocks, slots, num_slots - 1, origin)
    with pytest.raises(KernelError, match="bad argument"):  # a block run beyond the slots
        short = voxel.BlockKeys(blocks.words[:-1], blocks.block_run, blocks.shift)
        voxel.voxel_order(runs, short, slots[:-1], num_slots, origin)
    # two blocks given one slot: the same cell of each would be one voxel
    side = 1 << 5  # cell (0, 0, 0) of blocks x = 1 and x = 0
    two = np.array([side << 34, 0], np.int64)
    blocks, slots, _ = numpy_blocks(two)
    assert slots.tolist() == [1, 0]
    assert len(order(two)[1]) == 2  # a slot each: two voxels
    with pytest.raises(KernelError, match="bad argument"):
        voxel.voxel_order(two, blocks, np.zeros(2, np.int32), 1, origin)


def test_order_does_not_depend_on_the_thread_count():
    """Enough 8 x 8 rows of cells (over 8,192) that the threads split them, each (x, py) with
    rows of cells in up to eight z parts (read row by row across them), so a split that cut one
    would misplace its cells: the voxels and every run's row those of numpy, on 1, 2 and 3
    threads."""
    rng = np.random.default_rng(11)
    cells = rng.integers([0, 0, 0], [700, 16, 64], (40_000, 3))
    cells = np.repeat(cells, rng.integers(1, 3, len(cells)), axis=0)  # repeated cells
    runs = cells[:, 0] << 34 | cells[:, 1] << 17 | cells[:, 2]
    uniq = np.unique(runs)
    old = torch.get_num_threads()
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            voxel_of_run, coords = order(runs)
            assert np.array_equal(voxel_of_run, np.searchsorted(uniq, runs))
            fields = np.stack([uniq >> 34, uniq >> 17 & MASK, uniq & MASK], 1)
            assert np.array_equal(coords[:, 1:], fields)
    finally:
        torch.set_num_threads(old)
