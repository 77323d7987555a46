"""The CPU maps have two paths each that must give the same map: for rows in ascending (batch, x,
y, z) order (what the voxelizer and every downsampling produce) merge joins / per-slab sorts with
no hash table, and for any order 4x4x4 blocks (kernel-3 submanifold) or the hash table
(downsampling). Each is checked against the brute-force oracle, and each against the other."""

import pytest
import torch
from hypothesis import given, settings, strategies as st

from kernels import CoordinateRangeError, DuplicateCoordinateError, downsample, submanifold_map
from kernels.downsampling import _sorted_downsample_cpu
from kernels.kmap import _sorted_submanifold_map_cpu
from kernels.reference import brute_force_map, map_entries, unique_floor
from tests.conftest import FRAMES, frame_id, ours_threads, voxelized_frame
from tests.kernels.kernel_helpers import clouds, coords_tensor


def sort_rows(coords: torch.Tensor) -> torch.Tensor:
    return torch.unique(coords, dim=0) if len(coords) else coords  # lexicographic (b, x, y, z)


def same_map(a, b) -> bool:
    return (
        a.bounds == b.bounds
        and torch.equal(a.in_idx, b.in_idx)
        and torch.equal(a.out_idx, b.out_idx)
    )


@settings(max_examples=80, deadline=None)
@given(cloud=clouds(max_points=60, span=3))
def test_sorted_path_matches_oracle(cloud):
    cloud = sort_rows(cloud)
    fast = _sorted_submanifold_map_cpu(cloud)
    assert fast is not None, "sorted rows must take the merge-join path"
    assert map_entries(fast) == brute_force_map(cloud, cloud, 3)
    assert same_map(fast, submanifold_map(cloud, None, 3))


@settings(max_examples=40, deadline=None)
@given(cloud=clouds(max_points=60, span=3), seed=st.integers(0, 2**16))
def test_unsorted_rows_take_the_block_path(cloud, seed):
    perm = torch.randperm(len(cloud), generator=torch.Generator().manual_seed(seed))
    shuffled = cloud[perm]
    if len(shuffled) > 1 and not torch.equal(shuffled, sort_rows(shuffled)):
        assert _sorted_submanifold_map_cpu(shuffled) is None
    assert map_entries(submanifold_map(shuffled, None, 3)) == brute_force_map(shuffled, shuffled, 3)


def test_batches_and_range_edges():
    # Keys of neighbouring batches are adjacent in the packed order; coordinates on the edge of
    # the key range would carry into the next field, so the merge path declines them.
    inner = [(0, 5, 5, 5), (0, 5, 5, 6), (0, 6, 5, 5), (1, -3, 0, 0), (1, -2, 0, 0), (2, 0, 0, 0)]
    cloud = coords_tensor(inner)
    fast = _sorted_submanifold_map_cpu(cloud)
    assert fast is not None and map_entries(fast) == brute_force_map(cloud, cloud, 3)
    edge = sort_rows(
        coords_tensor(
            inner
            + [
                (0, 131071, 131071, 131071),
                (1, -131072, 0, 0),
                (1, -131072, 0, 1),
                (2, 0, 0, 131071),
            ]
        )
    )
    assert _sorted_submanifold_map_cpu(edge) is None
    assert map_entries(submanifold_map(edge, None, 3)) == brute_force_map(edge, edge, 3)


def test_sorted_input_errors_name_the_rows():
    with pytest.raises(DuplicateCoordinateError, match=r"\[0, 1, 2, 3\].*rows \[1, 2\]"):
        submanifold_map(coords_tensor([(0, 0, 0, 0), (0, 1, 2, 3), (0, 1, 2, 3)]), None, 3)
    with pytest.raises(CoordinateRangeError, match="row 1"):
        submanifold_map(coords_tensor([(0, 0, 0, 0), (0, 131072, 0, 0)]), None, 3)


@pytest.mark.parametrize("name", [pytest.param(n, id=frame_id(n)) for n, _ in FRAMES])
def test_both_paths_agree_on_real_frames(name):
    coords = voxelized_frame(name, 0.1)
    perm = torch.randperm(len(coords), generator=torch.Generator().manual_seed(0))
    with ours_threads():
        fast = _sorted_submanifold_map_cpu(coords)
        blocks = submanifold_map(coords[perm], None, 3)
    assert fast is not None
    # Row r of the shuffled cloud is row perm[r] of the sorted one; compare as entry sets.
    renumbered = {(int(perm[i]), int(perm[o]), k) for i, o, k in map_entries(blocks)}
    assert renumbered == map_entries(fast)
    assert fast.counts == blocks.counts
    # each offset's entries by output row (what the fused kernels' walk relies on): with the
    # entry sets equal, that fixes the map entry for entry
    for k in range(27):
        outs = fast.out_idx[fast.bounds[k] : fast.bounds[k + 1]]
        assert bool((outs[1:] > outs[:-1]).all()), k


@settings(max_examples=60, deadline=None)
@given(cloud=clouds(max_points=60, span=5), stride=st.sampled_from([2, 3]))
def test_sorted_downsample_matches_oracle(cloud, stride):
    cloud = sort_rows(cloud)
    made = _sorted_downsample_cpu(cloud, stride)
    assert made is not None, "sorted rows must take the path without a hash table"
    out_coords, kmap = made
    assert torch.equal(out_coords, unique_floor(cloud, stride))
    assert map_entries(kmap) == brute_force_map(cloud, out_coords, stride, stride, 0)
    assert sum(kmap.counts) == len(cloud)  # every input feeds exactly its parent
    coarse, table, same = downsample(cloud, None, stride, stride)
    assert table is None and torch.equal(coarse, out_coords) and same_map(same, kmap)


@pytest.mark.parametrize("stride", [2, 3, 4, 8])
def test_sorted_downsample_of_a_dense_block_matches_oracle(stride):
    """Parent columns of 2 * stride^2 * 12 rows (beyond the few rows a LiDAR column holds, so
    they take the n log n sort), negative coordinates, two batches; strides by shift and by
    division."""
    axis = torch.arange(-5, 7)
    grid = torch.cartesian_prod(torch.tensor([0, 1]), axis, axis, axis).to(torch.int32)
    cloud = sort_rows(grid[torch.arange(len(grid)) % 3 != 1])
    out_coords, kmap = _sorted_downsample_cpu(cloud, stride)
    assert torch.equal(out_coords, unique_floor(cloud, stride))
    assert map_entries(kmap) == brute_force_map(cloud, out_coords, stride, stride, 0)


def test_sorted_downsample_declines_unsorted_rows_and_reports_errors():
    rows = coords_tensor([(0, 3, 0, 0), (0, 1, 0, 0)])
    assert _sorted_downsample_cpu(rows, 2) is None
    with pytest.raises(DuplicateCoordinateError, match="rows \\[1, 2\\]"):
        downsample(coords_tensor([(0, 0, 0, 0), (0, 1, 2, 3), (0, 1, 2, 3)]), None, 2, 2)
    with pytest.raises(CoordinateRangeError, match="row 1"):
        downsample(coords_tensor([(0, 0, 0, 0), (1023, 0, 0, 0)]), None, 2, 2)


@pytest.mark.parametrize("name", [pytest.param(n, id=frame_id(n)) for n, _ in FRAMES])
def test_downsample_paths_agree_on_real_frames(name):
    coords = voxelized_frame(name, 0.05)
    perm = torch.randperm(len(coords), generator=torch.Generator().manual_seed(0))
    with ours_threads():
        fast_coords, fast = _sorted_downsample_cpu(coords, 2)
        hashed_coords, table, hashed = downsample(coords[perm], None, 2, 2)
    assert table is not None and torch.equal(fast_coords, hashed_coords)
    renumbered = {(int(perm[i]), o, k) for i, o, k in map_entries(hashed)}
    assert renumbered == map_entries(fast)
