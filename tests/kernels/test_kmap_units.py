"""kernels/kmap.py, kernels/downsampling.py and kernels/hashtable.py at what the oracle tests
never reach: dilated offsets by their known values and dilated maps against the brute force, an
even submanifold kernel, a transposed map's own plans, kernel == stride with padding, stride 3 on
negative rows, a stride past the sorted path, and the hash errors' checks and messages."""

from __future__ import annotations

import pytest
import torch

from kernels import CoordHashTable, CoordinateError, HashProbeError, downsample, submanifold_map
from kernels import backend
from kernels.grouping import build_plan
from kernels.hashtable import ERROR_ROW_BITS, raise_for_status
from kernels.kmap import kernel_offsets
from kernels.reference import brute_force_map, map_entries, unique_floor
from tests.conftest import DEVICES
from tests.kernels.kernel_helpers import random_cloud


def test_dilated_offsets_are_scaled_around_the_centre():
    offsets = kernel_offsets(3, 1, 2)
    assert offsets[0].tolist() == [-2, -2, -2] and offsets[13].tolist() == [0, 0, 0]
    assert offsets[26].tolist() == [2, 2, 2] and offsets[1].tolist() == [-2, -2, 0]
    assert kernel_offsets(2, 0, 3)[7].tolist() == [3, 3, 3]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ordered", [True, False], ids=["sorted", "unsorted"])
def test_a_dilated_submanifold_map_matches_the_brute_force(device, ordered):
    """Dilation 2 on the CPU: the kernel-3 merge-join and block paths know only dilation 1."""
    cloud = random_cloud(300, 5, seed=31)
    if ordered:
        cloud = torch.unique(cloud, dim=0)
    kmap = submanifold_map(cloud.to(device), None, 3, dilation=2)
    expected = brute_force_map(cloud, cloud, 3, dilation=2)
    assert len(expected) > len(cloud)  # neighbours two voxels apart, not only the identity
    assert map_entries(kmap) == expected


def test_an_even_submanifold_kernel_is_refused():
    with pytest.raises(ValueError, match="must be odd, got kernel_size=2"):
        submanifold_map(random_cloud(10, 3, seed=1), None, 2)


def test_a_transposed_map_plans_for_itself():
    """The map and its transpose (an inverse conv) have other row counts: a plan cached on one
    must not serve the other."""
    cloud = random_cloud(300, 6, seed=1)
    _, _, down = downsample(cloud, None, 2, 2)
    plan = build_plan(down, 0.0, 0.0)
    up = down.transposed
    assert up.plans is not down.plans
    up_plan = build_plan(up, 0.0, 0.0)
    assert up_plan is not plan and (up_plan.num_in, up_plan.num_out) == (down.num_out, len(cloud))


@pytest.mark.parametrize("ordered", [True, False], ids=["sorted", "unsorted"])
def test_kernel_equal_to_stride_with_padding_matches_the_brute_force(ordered):
    cloud = random_cloud(300, 6, seed=5)
    if ordered:
        cloud = torch.unique(cloud, dim=0)
    out, _, kmap = downsample(cloud, None, 2, 2, padding=1)
    assert torch.equal(out, unique_floor(cloud, 2))
    assert map_entries(kmap) == brute_force_map(cloud, out, 2, 2, 1)


def test_kernel_equal_to_stride_3_on_unsorted_negative_rows_matches_the_brute_force():
    """The hash path's parent cell position: floor remainders (-1 is position 2 of 3)."""
    cloud = random_cloud(300, 7, seed=9)  # unsorted: no sorted path
    assert bool((cloud[:, 1:] < 0).any())
    out, _, kmap = downsample(cloud, None, 3, 3)
    assert torch.equal(out, unique_floor(cloud, 3))
    assert map_entries(kmap) == brute_force_map(cloud, out, 3, 3, 0)


@pytest.mark.parametrize("stride", [8, 9, 16])
def test_large_strides_match_the_brute_force(stride):
    cloud = torch.unique(random_cloud(400, 40, seed=7), dim=0)  # sorted: the CPU's first choice
    out, _, kmap = downsample(cloud, None, stride, stride)
    assert torch.equal(out, unique_floor(cloud, stride))
    assert map_entries(kmap) == brute_force_map(cloud, out, stride, stride, 0)


@pytest.mark.parametrize("shape", [(4, 3), (4, 5)])
def test_coords_that_are_not_n_by_4_are_refused(shape):
    with pytest.raises(CoordinateError, match=r"int32 \[N, 4\]"):
        CoordHashTable.build(torch.zeros(shape, dtype=torch.int32))


def error_word(status: int, row: int) -> torch.Tensor:
    return torch.tensor([(int(status) << ERROR_ROW_BITS) | row], dtype=torch.int64)


def test_a_probe_limit_raises_hash_probe_error_naming_its_row():
    coords = torch.tensor([[0, 1, 2, 3], [0, 4, 5, 6]], dtype=torch.int32)
    with pytest.raises(HashProbeError, match=r"insert of \[0, 4, 5, 6\] \(row 1\)"):
        raise_for_status(error_word(backend.Status.PROBE_LIMIT, 1), coords)


def test_an_error_row_takes_every_row_bit():
    coords = torch.zeros(3, 4, dtype=torch.int32)
    row = 1 << (ERROR_ROW_BITS - 1)  # past the coords: no value, but the row as recorded
    with pytest.raises(backend.KernelError, match=f"status 5 at row {row}$"):
        raise_for_status(error_word(backend.Status.CUDA_ERROR, row), coords)
    with pytest.raises(CoordinateError, match=f"None at row {len(coords)} "):
        raise_for_status(error_word(backend.Status.OUT_OF_RANGE, len(coords)), coords)
