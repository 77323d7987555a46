"""Map building against a brute-force oracle, the seeds' worked example, and error cases."""

import pytest
import torch
from hypothesis import given, settings, strategies as st

from kernels import (
    CoordHashTable,
    CoordinateRangeError,
    DuplicateCoordinateError,
    downsample,
    submanifold_map,
)
from kernels.reference import brute_force_map, map_entries, unique_floor
from tests.conftest import DEVICES
from tests.kernels.kernel_helpers import clouds, coords_tensor


def sub_map(coords, k=3):
    return submanifold_map(coords, CoordHashTable.build(coords), k)


@pytest.mark.parametrize("device", DEVICES)
def test_seed_five_point_example(device):
    # The notes' 5 x 5 grid: P0 (1,1), P1 (2,2), P2 (2,4), P3 (3,2), P4 (4,3) on a z = 0 slice.
    points = [(1, 1), (2, 2), (2, 4), (3, 2), (4, 3)]
    coords = coords_tensor([(0, r, c, 0) for r, c in points], device)
    kmap = sub_map(coords)
    counts = kmap.counts
    assert sum(counts) == 11
    assert [c for c in counts if c] == [2, 1, 5, 1, 2]
    # W(-1,-1): (P0 -> Q1) and (P3 -> Q4), since P = Q + d.
    ins, outs = kmap.entries(0 * 9 + 0 * 3 + 1)  # d = (-1, -1, 0) -> position (0, 0, 1)
    assert sorted(zip(ins.tolist(), outs.tolist())) == [(0, 1), (3, 4)]
    assert kmap.identity == 13 and kmap.bounds[13] == kmap.bounds[14]  # not materialised


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=60, deadline=None)
@given(cloud=clouds(), kernel=st.sampled_from([1, 3, 5]))
def test_submanifold_map_matches_oracle(device, cloud, kernel):
    kmap = sub_map(cloud.to(device), kernel)
    assert map_entries(kmap) == brute_force_map(cloud, cloud, kernel)
    counts = kmap.counts
    assert all(counts[k] == counts[kernel**3 - 1 - k] for k in range(kernel**3))


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=60, deadline=None)
@given(cloud=clouds(), case=st.sampled_from([(2, 2, 0), (3, 2, 1), (2, 3, 0)]))
def test_downsample_matches_oracle(device, cloud, case):
    kernel, stride, padding = case
    on_device = cloud.to(device)
    out_coords, out_table, kmap = downsample(
        on_device, CoordHashTable.build(on_device), kernel, stride, padding
    )
    out_coords = out_coords.cpu()
    assert torch.equal(out_coords, unique_floor(cloud, stride))
    assert map_entries(kmap) == brute_force_map(cloud, out_coords, kernel, stride, padding)
    # The coarse table (None where the sorted CPU path needed none) maps every output
    # coordinate to its row.
    if out_table is not None:
        nbr, _ = out_table.lookup(out_coords.to(device))
        assert torch.equal(nbr[0].cpu(), torch.arange(len(out_coords), dtype=torch.int32))
    # Inverse map: the transposed entries, outputs on the finer level.
    inverse = kmap.transposed
    assert inverse.num_out == len(cloud) and inverse.num_in == len(out_coords)
    assert map_entries(inverse) == {(q, p, k) for p, q, k in map_entries(kmap)}


@pytest.mark.parametrize("device", DEVICES)
def test_k2_downsample_covers_every_input_once(device):
    cloud = torch.unique(torch.randint(-50, 50, (3000, 4), dtype=torch.int32), dim=0)
    cloud[:, 0] = cloud[:, 0].abs() % 3
    cloud = torch.unique(cloud, dim=0).to(device)
    _, _, kmap = downsample(cloud, CoordHashTable.build(cloud), 2, 2)
    assert sorted(kmap.in_idx.tolist()) == list(range(len(cloud)))


@pytest.mark.parametrize("device", DEVICES)
def test_maps_are_deterministic(device):
    gen = torch.Generator().manual_seed(0)
    cloud = torch.unique(torch.randint(-30, 30, (5000, 4), generator=gen, dtype=torch.int32), dim=0)
    cloud[:, 0] = 0
    cloud = torch.unique(cloud, dim=0)[
        torch.randperm(len(torch.unique(cloud, dim=0)), generator=gen)
    ]
    cloud = cloud.to(device)
    a, b = sub_map(cloud), sub_map(cloud)
    assert torch.equal(a.in_idx, b.in_idx) and torch.equal(a.out_idx, b.out_idx)
    da, db = (
        downsample(cloud, CoordHashTable.build(cloud)),
        downsample(cloud, CoordHashTable.build(cloud)),
    )
    assert torch.equal(da[0], db[0]) and torch.equal(da[2].in_idx, db[2].in_idx)


@pytest.mark.parametrize("device", DEVICES)
def test_duplicates_are_rejected_with_rows(device):
    cloud = coords_tensor([(0, 1, 2, 3), (0, 4, 5, 6), (0, 1, 2, 3)], device)
    with pytest.raises(DuplicateCoordinateError, match=r"\[0, 1, 2, 3\].*rows \[0, 2\]"):
        CoordHashTable.build(cloud)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "bad", [(0, 131072, 0, 0), (0, 0, -131073, 0), (1023, 0, 0, 0), (-1, 0, 0, 0)]
)
def test_out_of_range_is_an_error_not_a_wrap(device, bad):
    with pytest.raises(CoordinateRangeError, match=r"outside the supported range"):
        CoordHashTable.build(coords_tensor([(0, 0, 0, 0), bad], device))
    with pytest.raises(CoordinateRangeError, match=r"at row 1 "):
        downsample(coords_tensor([(0, 0, 0, 0), bad], device), None, 3, 2, 1)


@pytest.mark.parametrize("device", DEVICES)
def test_lookup_outside_range_misses_instead_of_aliasing(device):
    table = CoordHashTable.build(coords_tensor([(0, -131072, 0, 0), (0, 131071, 5, 5)], device))
    nbr, counts = table.lookup(
        coords_tensor(
            [(0, 131072, 0, 0), (0, -131072, 0, 0), (0, 131071, 5, 5), (0, 3, 3, 3)], device
        )
    )
    assert nbr[0].tolist() == [-1, 0, 1, -1] and counts.tolist() == [2]
    # Offsets that step past the edge miss too.
    nbr, _ = table.lookup(
        coords_tensor([(0, 131071, 5, 5)], device), 1, torch.tensor([[1, 0, 0]], dtype=torch.int32)
    )
    assert nbr.tolist() == [[-1]]


@pytest.mark.parametrize("device", DEVICES)
def test_empty_cloud(device):
    empty = torch.zeros(0, 4, dtype=torch.int32, device=device)
    kmap = sub_map(empty)
    assert kmap.num_in == 0 and kmap.in_idx.numel() == 0 and sum(kmap.counts) == 0
    assert kmap.transposed.in_idx.numel() == 0
    out_coords, _, dmap = downsample(empty, CoordHashTable.build(empty))
    assert out_coords.shape == (0, 4) and dmap.in_idx.numel() == 0
    assert sum(dmap.transposed.counts) == 0


def test_capacity_and_load_factor():
    from kernels.hashtable import capacity_for

    assert capacity_for(0) == 16 and capacity_for(8) == 16 and capacity_for(9) == 32
    for n in (100, 91767, 1 << 20):
        cap = capacity_for(n)
        assert cap & (cap - 1) == 0 and n / cap <= 0.5 < 2 * n / cap


def test_bad_coords_dtype():
    from kernels import CoordinateError

    with pytest.raises(CoordinateError, match="int32"):
        CoordHashTable.build(torch.zeros(3, 4, dtype=torch.int64))


@pytest.mark.parametrize("kernel", [2, 3])  # k2 s2: already in order (a copy); k3 s2: re-sorted
def test_transposed_maps_are_sorted_by_output_per_offset(kernel):
    cloud = torch.unique(torch.randint(-30, 30, (4000, 4), dtype=torch.int32), dim=0)
    cloud[:, 0] = cloud[:, 0].abs() % 2
    cloud = torch.unique(cloud, dim=0)
    _, _, kmap = downsample(cloud, CoordHashTable.build(cloud), kernel, 2)
    inverse = kmap.transposed
    assert map_entries(inverse) == {(q, p, k) for p, q, k in map_entries(kmap)}
    for k in range(inverse.kernel_volume):
        outs = inverse.entries(k)[1]
        assert bool((outs[1:] > outs[:-1]).all()), f"offset {k} not ascending"


@pytest.mark.parametrize("twin", ["c", "torch"])  # the C kernel (CPU), the torch ops (CUDA)
def test_sort_by_out_refuses_an_output_out_of_range_or_twice(twin):
    from kernels.backend import KernelError
    from kernels.kmap import _sort_by_out_torch, sort_by_out

    sort = sort_by_out if twin == "c" else _sort_by_out_torch
    ins = torch.tensor([5, 6, 7], dtype=torch.int32)
    for outs in ([0, 1, 9], [2, 0, 2]):  # 9 >= num_out; 2 twice (not ascending: the slow path)
        with pytest.raises(KernelError, match="bad argument"):
            sort(ins, torch.tensor(outs, dtype=torch.int32), (0, 3), 4)
    with pytest.raises(KernelError, match="bad argument"):  # 5 >= 3 would have moved to offset 1
        sort(torch.arange(4, dtype=torch.int32), torch.tensor([0, 5, 1, 2]).int(), (0, 2, 4), 3)
    with pytest.raises(KernelError, match="bad argument"):  # a one-entry offset is checked too
        sort(torch.arange(2, dtype=torch.int32), torch.tensor([7, 1]).int(), (0, 1, 2), 3)
    got = sort(ins, torch.tensor([3, 0, 1], dtype=torch.int32), (0, 3), 4)
    assert got[0].tolist() == [6, 7, 5] and got[1].tolist() == [0, 1, 3]


@pytest.mark.parametrize("device", DEVICES)
def test_lookup_takes_at_most_max_offsets_on_every_twin(device):
    from kernels import backend
    from kernels.hashtable import MAX_OFFSETS

    table = CoordHashTable.build(coords_tensor([(0, 0, 0, 0)], device))
    query = coords_tensor([(0, 0, 0, 0)], device)
    offsets = torch.zeros(MAX_OFFSETS + 1, 3, dtype=torch.int32, device=device)
    nbr, counts = table.lookup(query, 1, offsets[:MAX_OFFSETS])
    assert counts.tolist() == [1] * MAX_OFFSETS
    with pytest.raises(ValueError, match=f"at most {MAX_OFFSETS}"):
        table.lookup(query, 1, offsets)
    nbr = torch.empty(len(offsets), 1, dtype=torch.int32, device=device)
    counts = torch.empty(len(offsets), dtype=torch.int64, device=device)
    with pytest.raises(backend.KernelError, match="bad argument"):  # the C twins' own check
        backend.call(
            "kmap_lookup", table.device, table.slots, table.capacity, query, 1, 1, offsets,
            len(offsets), nbr, counts,
        )  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
def test_lookup_at_a_large_stride_misses_instead_of_wrapping(device):
    """x * stride + d beyond 32 bits: a miss, not the voxel it wraps to (65,536 * 65,536 is
    2^32, which an int32 product wrapped to 0 and found (0, 0, 0, 0))."""
    table = CoordHashTable.build(coords_tensor([(0, 0, 0, 0), (0, 1, 0, 0)], device))
    query = coords_tensor([(0, 65536, 0, 0), (0, 0, 65536, 0), (0, 0, 0, 0)], device)
    nbr, counts = table.lookup(query, 65536)
    assert nbr.tolist() == [[-1, -1, 0]] and counts.tolist() == [1]
    offsets = torch.tensor([[1, 0, 0]], dtype=torch.int32)
    nbr, _ = table.lookup(coords_tensor([(0, 65536, 0, 0)], device), 65536, offsets)
    assert nbr.tolist() == [[-1]]  # 2^32 + 1 wrapped to row 1
