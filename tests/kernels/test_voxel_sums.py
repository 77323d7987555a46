"""The voxelizer's sums pass (kernels/voxel.py voxel_sums) against numpy oracles, bit for bit:
feature sums as numpy's bincount, means as numpy's float64 division; on any thread count."""

import numpy as np
import pytest
import torch

from kernels import voxel
from kernels.backend import KernelError


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
