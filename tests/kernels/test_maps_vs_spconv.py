"""Our kernel maps against spconv's indice pairs (CPU, Native algorithm) on the real frames.

spconv 2.3.8 CPU layout, read from spconv/pytorch/ops.py (get_indice_pairs, indice_conv) and
checked here (test_spconv_subm_pair_layout):
- IndiceData.indice_pairs is int32 [2, K^3, N_in], filled with -1; row 0 holds input rows and
  row 1 output rows (indice_conv reads pair_in = pairs[inverse], pair_out = pairs[not inverse]).
- The kernel index is k = a*K*K + b*K + c for position (a, b, c), with input = out*stride +
  (a, b, c) - padding on (x, y, z) -- the same convention as ours (kernels/kmap.py).
- Submanifold maps: indice_pair_num [K^3] counts only the offsets k < centre; the entries of a
  mirror offset k > centre are stored at pairs[:, k, :num[K^3-1-k]] (those of K^3-1-k with in and
  out swapped) while num[k] stays 0; the centre row is arange(N) with num[centre] = 0 (the
  identity is applied by a separate mm).
- Strided maps: num[k] counts every offset; row 1 indexes spconv's output rows (its own order).
"""

from __future__ import annotations

import pytest
import torch

from models import SparseConv3d, SparseTensor, native_algo
from tests.conftest import (
    FRAMES,
    coord_keys,
    frame_id,
    ours_threads,
    single_thread,
    spconv_grid,
    voxelized_frame,
)

KITTI = FRAMES[0][0]
MAP_CASES = [pytest.param(name, 0.1, id=f"{frame_id(name)}-0.1m") for name, _ in FRAMES] + [
    pytest.param(KITTI, 0.05, id=f"{frame_id(KITTI)}-0.05m")
]
COUNT_CASES = [
    pytest.param(name, vs, id=f"{frame_id(name)}-{vs}m")
    for name, _ in FRAMES
    for vs in (0.05, 0.1, 0.2)
]


def _spconv_subm_pairs(spconv, coords: torch.Tensor, kernel_size: int = 3):
    shifted, _, shape = spconv_grid(coords)
    with single_thread(), torch.no_grad():
        x = spconv.SparseConvTensor(torch.zeros(coords.shape[0], 1), shifted, shape, 1)
        y = spconv.SubMConv3d(1, 1, kernel_size, bias=False, algo=native_algo(), indice_key="subm")(
            x
        )
    data = y.indice_dict["subm"]
    assert data.is_subm
    return data.indice_pairs, data.indice_pair_num


def _triples(ks, ins, outs, n_in: int, n_out: int) -> torch.Tensor:
    """Sorted int64 codes of (kernel index, in row, out row)."""
    k = torch.cat([torch.full((len(i),), kk, dtype=torch.int64) for kk, i in zip(ks, ins)])
    i = torch.cat([t.to(torch.int64) for t in ins])
    o = torch.cat([t.to(torch.int64) for t in outs])
    assert bool(((i >= 0) & (i < n_in)).all()) and bool(((o >= 0) & (o < n_out)).all())
    return torch.sort((k * n_in + i) * n_out + o).values


def _spconv_subm_triples(pairs, num, n: int, kernel_size: int = 3) -> torch.Tensor:
    kv = kernel_size**3
    centre = kv // 2
    ins, outs = [], []
    for k in range(kv):
        if k == centre:
            ins.append(torch.arange(n))
            outs.append(torch.arange(n))
            continue
        m = int(num[k] if k < centre else num[kv - 1 - k])
        ins.append(pairs[0, k, :m])
        outs.append(pairs[1, k, :m])
    return _triples(range(kv), ins, outs, n, n)


def _our_triples(kmap) -> torch.Tensor:
    ins, outs = zip(*(kmap.entries(k) for k in range(kmap.kernel_volume)))
    return _triples(range(kmap.kernel_volume), ins, outs, kmap.num_in, kmap.num_out)


def test_spconv_subm_pair_layout(spconv):
    """Pin down the spconv layout the other tests rely on (see the module docstring)."""
    coords = voxelized_frame(KITTI, 0.1)
    shifted, _, _ = spconv_grid(coords)
    pairs, num = _spconv_subm_pairs(spconv, coords)
    n = coords.shape[0]
    assert pairs.shape == (2, 27, n) and pairs.dtype == torch.int32
    assert bool((num[13:] == 0).all()) and bool((num[:13] > 0).all())
    assert torch.equal(pairs[0, 13], torch.arange(n, dtype=torch.int32))
    assert torch.equal(pairs[1, 13], torch.arange(n, dtype=torch.int32))
    for k in range(13):
        m = int(num[k])
        a, b, c = k // 9, k // 3 % 3, k % 3
        i, o = pairs[0, k, :m].long(), pairs[1, k, :m].long()
        d = shifted[i, 1:] - shifted[o, 1:]
        assert bool((d == torch.tensor([a - 1, b - 1, c - 1], dtype=torch.int32)).all())
        assert torch.equal(shifted[i, 0], shifted[o, 0])
        assert torch.equal(pairs[0, 26 - k, :m], pairs[1, k, :m])
        assert torch.equal(pairs[1, 26 - k, :m], pairs[0, k, :m])
        assert bool((pairs[:, k, m:] == -1).all())


@pytest.mark.parametrize("order", ["sorted", "shuffled"])
@pytest.mark.parametrize("name,vs", MAP_CASES)
def test_submanifold_k3_map_equals_spconv_pairs(spconv, name, vs, order):
    # Sorted rows take the merge-join path, shuffled rows the block path (kernels/kmap.py).
    coords = voxelized_frame(name, vs)
    if order == "shuffled":
        coords = coords[torch.randperm(len(coords), generator=torch.Generator().manual_seed(1))]
    n = coords.shape[0]
    pairs, num = _spconv_subm_pairs(spconv, coords)
    with ours_threads():
        x = SparseTensor(torch.zeros(n, 1), coords)
        kmap = x.manager.submanifold_map(1, 3)
    assert kmap.num_in == kmap.num_out == n and kmap.identity == 13
    ours = _our_triples(kmap)
    ref = _spconv_subm_triples(pairs, num, n)
    assert ours.numel() == ref.numel()
    assert bool((ours[1:] != ours[:-1]).all()), "duplicate map entries"
    assert torch.equal(ours, ref)
    # per-offset counts too (spconv counts only the first half)
    assert kmap.counts[:13] == num[:13].tolist()
    assert kmap.counts[13] == n


def _independent_counts(coords: torch.Tensor) -> list[int]:
    """count(d) = #{q : q + d is a voxel} for the 27 offsets, by sorted-key membership."""
    keys = coord_keys(coords)
    sorted_keys = torch.sort(keys).values
    counts = []
    for a in range(3):
        for b in range(3):
            for c in range(3):
                shifted = coords.clone()
                shifted[:, 1:] += torch.tensor([a - 1, b - 1, c - 1], dtype=torch.int32)
                probe = coord_keys(shifted)
                pos = torch.searchsorted(sorted_keys, probe).clamp(max=len(sorted_keys) - 1)
                counts.append(int((sorted_keys[pos] == probe).sum()))
    return counts


@pytest.mark.parametrize("name,vs", COUNT_CASES)
def test_submanifold_counts_symmetric(name, vs):
    coords = voxelized_frame(name, vs)
    with ours_threads():
        kmap = SparseTensor(torch.zeros(coords.shape[0], 1), coords).manager.submanifold_map(1, 3)
    counts = kmap.counts
    assert all(counts[k] == counts[26 - k] for k in range(27))
    assert counts == _independent_counts(coords)


@pytest.mark.parametrize(
    "name,vs",
    [
        pytest.param(KITTI, 0.1, id="seq00_000000-0.1m"),
        pytest.param(FRAMES[4][0], 0.05, id="ouster-0.05m"),
    ],
)
def test_downsample_k2s2_map_equals_spconv_pairs(spconv, name, vs):
    coords = voxelized_frame(name, vs)
    shifted, shift, shape = spconv_grid(coords)
    n = coords.shape[0]
    with single_thread(), torch.no_grad():
        x = spconv.SparseConvTensor(torch.zeros(n, 1), shifted, shape, 1)
        y = spconv.SparseConv3d(1, 1, 2, 2, bias=False, algo=native_algo(), indice_key="down")(x)
    data = y.indice_dict["down"]
    assert not data.is_subm and data.indice_pairs.shape == (2, 8, n)
    with ours_threads():
        xo = SparseTensor(torch.zeros(n, 1), coords)
        yo = SparseConv3d(1, 1, 2, 2)(xo)
        kmap = xo.manager.downsample(1, 2, 2).kmap
    ref_coarse = y.indices.clone()
    ref_coarse[:, 1:] -= (shift // 2).to(torch.int32)
    assert kmap.num_in == n and kmap.num_out == yo.coords.shape[0] == ref_coarse.shape[0]
    # Coarse rows are ordered differently; name them by coordinate key instead.
    all_keys = torch.unique(torch.cat([coord_keys(yo.coords), coord_keys(ref_coarse)]))
    assert all_keys.numel() == kmap.num_out, "coarse coordinate sets differ"
    our_id = torch.searchsorted(all_keys, coord_keys(yo.coords))
    ref_id = torch.searchsorted(all_keys, coord_keys(ref_coarse))
    num = data.indice_pair_num.tolist()
    ref = _triples(
        range(8),
        [data.indice_pairs[0, k, : num[k]] for k in range(8)],
        [ref_id[data.indice_pairs[1, k, : num[k]].long()] for k in range(8)],
        n,
        n,
    )
    ins, outs = zip(*(kmap.entries(k) for k in range(8)))
    ours = _triples(range(8), ins, [our_id[o.long()] for o in outs], n, n)
    assert torch.equal(ours, ref)
    assert kmap.counts == num
    assert sum(num) == n  # kernel 2 stride 2: every fine voxel feeds exactly one coarse voxel
