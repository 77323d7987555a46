"""Kernels at their exact bounds no other test reaches: an output row equal to num_out, points
exactly on the range's bounds. (From a hand-made mutation audit, 2026-12-06.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch


@pytest.mark.parametrize("twin", ["c", "torch"])  # the C kernel (CPU), the torch ops (CUDA)
def test_sort_by_out_refuses_an_output_equal_to_num_out(twin):
    """kmap.py _sort_by_out_torch: an output row of exactly num_out is out of range (`>=`); in
    the last offset it collides with nothing, so only the range check can refuse it."""
    from kernels.backend import KernelError
    from kernels.kmap import _sort_by_out_torch, sort_by_out

    sort = sort_by_out if twin == "c" else _sort_by_out_torch
    ins = torch.tensor([5, 6, 7], dtype=torch.int32)
    with pytest.raises(KernelError, match="bad argument"):
        sort(ins, torch.tensor([0, 1, 4], dtype=torch.int32), (0, 3), 4)
    got = sort(ins, torch.tensor([3, 0, 1], dtype=torch.int32), (0, 3), 4)  # num_out - 1: fine
    assert got[1].tolist() == [0, 1, 3]


def test_points_exactly_on_the_range_bounds_are_kept():
    """csrc/voxel_points.h PointRule: |x| <= max_xy, |y| <= max_xy, z_lo <= z <= z_hi, all
    inclusive (the rule valid_mask documents and test_pipeline's numpy oracle applies, but no
    frame there has a point exactly on a bound); a hair beyond is out of range."""
    from kernels.voxel import valid_points

    m = 120.0
    beyond = float(np.nextafter(np.float32(m), np.float32(np.inf)))
    points = np.array(
        [
            [m, 0, 0], [-m, 0, 0], [0, m, 0], [0, -m, 0], [0, 0, -20], [0, 0, 20],  # kept
            [beyond, 0, 0], [0, -beyond, 0], [0, 0, 20.01], [0, 0, -20.01],  # out of range
            [np.nan, 0, 0],  # not finite
        ],
        np.float32,
    )  # fmt: skip
    keep, non_finite, out_of_range, _ = valid_points(points, m, (-20.0, 20.0))
    assert keep.tolist() == [True] * 6 + [False] * 5
    assert (non_finite, out_of_range) == (1, 4)
    four = np.column_stack([points, np.full(len(points), 0.5, np.float32)])  # kCols == 4 path
    assert valid_points(four, m, (-20.0, 20.0))[0].tolist() == keep.tolist()
    five = np.column_stack([four, np.zeros(len(points), np.float32)])  # the chunked path
    assert valid_points(five, m, (-20.0, 20.0))[0].tolist() == keep.tolist()
