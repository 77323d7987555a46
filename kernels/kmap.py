"""Kernel maps (In, Out, Wgt): which input row feeds which output row through which weight.

Conventions (fixed for the whole project):
- Kernel index k = a*K*K + b*K + c for the kernel position (a, b, c) in [0, K)^3.
- The input feeding output q through position (a, b, c) sits at q*stride + ((a, b, c) - padding)
  * dilation on (x, y, z), in the same batch. For submanifold maps padding = K // 2, so the offset
  is d = (a, b, c) - K // 2 and P = Q + d.
- Entries are stored offset-major (kernel index ascending), then by output row ascending (the
  fused CPU engine partitions work by output rows); the same input gives the same map, on CPU and
  CUDA alike.
- Submanifold maps: the centre offset is the identity and is not materialised; only the offsets
  before the centre are looked up, and the map of -d (index K^3 - 1 - k) is the map of d with in
  and out swapped, so count(d) == count(-d) by construction.
- How entries are found (each path gives the same map, entry for entry): on the CPU, rows in
  ascending (batch, x, y, z) order (the voxelizer's order, kept by every downsampling) take
  merge joins over packed keys for kernel-3 submanifold maps (csrc/sorted_kmap_cpu.cpp) and
  per-column sorts for kernel == stride downsampling (kernels/downsampling.py,
  csrc/sorted_downsample_cpu.cpp), with no hash table; kernel-3 maps of rows in any other
  order go through 4x4x4 voxel blocks (csrc/block_kmap_cpu.cpp); everything else, and
  everything on CUDA, probes the coordinate hash table. A 1x1 map is the identity alone and
  needs no look-up anywhere.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from itertools import product

import torch

from . import backend
from .hashtable import (
    CoordHashTable,
    check_coords,
    new_error_buffer,
    raise_for_status,
)


def kernel_offsets(kernel_size: int, padding: int, dilation: int = 1) -> torch.Tensor:
    """int32 [K^3, 3]: ((a, b, c) - padding) * dilation in kernel-index order (c fastest)."""
    rng = range(kernel_size)
    pos = torch.tensor(list(product(rng, rng, rng)), dtype=torch.int32)
    return (pos - padding) * dilation


@dataclass(frozen=True, eq=False)
class KernelMap:
    """Per kernel index k, the rows in_idx/out_idx[bounds[k]:bounds[k+1]] (int32)."""

    in_idx: torch.Tensor
    out_idx: torch.Tensor
    bounds: tuple[int, ...]  # K^3 + 1 prefix sums of the per-offset counts
    kernel_size: int
    num_in: int
    num_out: int
    identity: int | None = None  # kernel index whose map is the identity (not materialised)
    symmetric: bool = False  # entries of K^3-1-k are those of k with in and out swapped
    plans: dict = field(default_factory=dict, repr=False)  # execution plans, filled by the engine

    @property
    def kernel_volume(self) -> int:
        return self.kernel_size**3

    @property
    def counts(self) -> list[int]:
        """Entries per kernel index; the identity offset counts num_in."""
        c = [self.bounds[k + 1] - self.bounds[k] for k in range(self.kernel_volume)]
        if self.identity is not None:
            c[self.identity] = self.num_in
        return c

    @property
    def device(self) -> torch.device:
        return self.in_idx.device

    @functools.cached_property
    def bounds_tensor(self) -> torch.Tensor:
        """bounds as an int64 tensor (the fused kernels' argument), made once per map."""
        return torch.tensor(self.bounds, dtype=torch.int64)

    def entries(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(in rows, out rows) of kernel index k; the identity offset gives arange(num_in) twice."""
        if k == self.identity:
            rows = torch.arange(self.num_in, dtype=torch.int32, device=self.device)
            return rows, rows
        lo, hi = self.bounds[k], self.bounds[k + 1]
        return self.in_idx[lo:hi], self.out_idx[lo:hi]

    @functools.cached_property
    def transposed(self) -> "KernelMap":
        """The same entries with in and out swapped (the inverse convolution's map), each
        offset's entries re-sorted by their new output row."""
        in_idx, out_idx = sort_by_out(self.out_idx, self.in_idx, self.bounds, self.num_in)
        return replace(
            self, in_idx=in_idx, out_idx=out_idx, num_in=self.num_out, num_out=self.num_in, plans={}
        )


def sort_by_out(
    in_idx: torch.Tensor, out_idx: torch.Tensor, bounds: tuple[int, ...], num_out: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reorders each offset's entries by output row (same result on CPU and CUDA)."""
    if in_idx.numel() == 0:
        return in_idx, out_idx
    if in_idx.device.type == "cpu":
        in_sorted, out_sorted = torch.empty_like(in_idx), torch.empty_like(out_idx)
        bounds_t = torch.tensor(bounds, dtype=torch.int64)
        backend.call(
            "sort_entries_by_out",
            in_idx.device,
            in_idx,
            out_idx,
            bounds_t,
            len(bounds) - 1,
            num_out,
            in_sorted,
            out_sorted,
        )
        return in_sorted, out_sorted
    return _sort_by_out_torch(in_idx, out_idx, bounds, num_out)


def _sort_by_out_torch(
    in_idx: torch.Tensor, out_idx: torch.Tensor, bounds: tuple[int, ...], num_out: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """sort_by_out on CUDA, in torch ops (on any device: the tests run it on the CPU too)."""
    counts = torch.tensor([b - a for a, b in zip(bounds[:-1], bounds[1:])], device=in_idx.device)
    segment = torch.repeat_interleave(torch.arange(len(counts), device=in_idx.device), counts)
    keys, order = torch.sort(segment * max(num_out, 1) + out_idx.long(), stable=True)
    outside = (out_idx < 0) | (out_idx >= num_out)  # the C twin's checks, one sync for both
    if bool(outside.any() | (keys[1:] == keys[:-1]).any()):
        backend.refuse("sort_entries_by_out", in_idx.device, "an output out of range or twice")
    return in_idx[order], out_idx[order]


def _compact(nbr: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list]:
    """nbr [K, n_out] -> (in, out) entries offset-major, output-ascending; and per-k counts."""
    count_list = counts.tolist()
    total = sum(count_list)
    if nbr.device.type == "cpu":
        starts = torch.tensor([0] + count_list[:-1], dtype=torch.int64).cumsum(0)
        in_idx = torch.empty(total, dtype=torch.int32)
        out_idx = torch.empty(total, dtype=torch.int32)
        backend.call(
            "kmap_compact", nbr.device, nbr, nbr.shape[0], nbr.shape[1], starts, in_idx, out_idx
        )
    else:  # nonzero is row-major, which is the same order as the CPU compaction
        k, q = (nbr >= 0).nonzero(as_tuple=True)
        in_idx = nbr[k, q].to(torch.int32)
        out_idx = q.to(torch.int32)
    return in_idx, out_idx, count_list


def _prefix(counts: list[int]) -> tuple[int, ...]:
    bounds = [0]
    for c in counts:
        bounds.append(bounds[-1] + c)
    return tuple(bounds)


def _submanifold_nbr_cpu(coords: torch.Tensor, offsets: torch.Tensor):
    """The same (nbr, counts) as table.lookup(coords, 1, offsets) for offsets in {-1, 0, 1}^3,
    built from 4x4x4 voxel blocks instead of one voxel-table probe per (voxel, offset)."""
    coords = coords.contiguous()
    offsets = offsets.contiguous()
    n = coords.shape[0]
    nbr = torch.empty(len(offsets), n, dtype=torch.int32)
    counts = torch.empty(len(offsets), dtype=torch.int64)
    err = new_error_buffer(coords.device)
    backend.call(
        "submanifold_nbr", coords.device, coords, n, offsets, len(offsets), nbr, counts, err
    )
    raise_for_status(err, coords)
    return nbr, counts


def _sorted_submanifold_map_cpu(coords: torch.Tensor) -> KernelMap | None:
    """The kernel-3 submanifold map by merge joins (csrc/sorted_kmap_cpu.cpp) when coords are in
    ascending (batch, x, y, z) order, as the voxelizer and every downsampled level give them;
    None when they are not (the caller takes the block path). Entry for entry the same map. One
    kernel call: the entries go into buffers of the largest size a map can have (every
    neighbour present), and the map keeps views of the part it fills."""
    n = coords.shape[0]
    capacity = 2 * 13 * n
    in_idx = torch.empty(capacity, dtype=torch.int32)
    out_idx = torch.empty(capacity, dtype=torch.int32)
    counts = torch.empty(13, dtype=torch.int64)
    applied = torch.zeros(1, dtype=torch.int64)
    err = new_error_buffer(coords.device)
    backend.call(
        "sorted_submanifold_map",
        coords.device,
        coords,
        n,
        in_idx,
        out_idx,
        capacity,
        counts,
        applied,
        err,
    )
    raise_for_status(err, coords)
    if not applied.item():
        return None
    half_counts = counts.tolist()
    total = 2 * sum(half_counts)
    return _symmetric_map(in_idx[:total], out_idx[:total], half_counts, 3, n)


def _symmetric_map(in_idx, out_idx, half_counts: list[int], kernel_size: int, n: int):
    """A submanifold KernelMap from its entries: the half offsets, then their mirrors."""
    return KernelMap(
        in_idx=in_idx,
        out_idx=out_idx,
        bounds=_prefix(half_counts + [0] + half_counts[::-1]),
        kernel_size=kernel_size,
        num_in=n,
        num_out=n,
        identity=kernel_size**3 // 2,
        symmetric=True,
    )


def submanifold_map(
    coords: torch.Tensor,
    table: CoordHashTable | None = None,
    kernel_size: int = 3,
    dilation: int = 1,
) -> KernelMap:
    """Stride-1 map of an odd kernel on one coordinate set (outputs = inputs). `table` (a hash
    table of coords) is only needed off the CPU kernel-3 paths; it is built when missing."""
    if kernel_size % 2 != 1:
        raise ValueError(f"submanifold kernels must be odd, got kernel_size={kernel_size}")
    check_coords(coords)
    coords = coords.contiguous()
    if kernel_size == 1:  # only the centre: the identity, nothing to look up
        empty = torch.zeros(0, dtype=torch.int32, device=coords.device)
        return _symmetric_map(empty, empty.clone(), [], 1, coords.shape[0])
    centre = kernel_size**3 // 2
    needs_table = submanifold_needs_table(coords.device, kernel_size, dilation)
    if not needs_table:
        kmap = _sorted_submanifold_map_cpu(coords)
        if kmap is not None:
            return kmap
    offsets = kernel_offsets(kernel_size, kernel_size // 2, dilation)[:centre]
    if not needs_table:
        nbr, counts = _submanifold_nbr_cpu(coords, offsets)
    else:
        table = table if table is not None else CoordHashTable.build(coords)
        nbr, counts = table.lookup(coords, 1, offsets)
    in_half, out_half, half_counts = _compact(nbr, counts)
    half_bounds = _prefix(half_counts)
    # Mirror offsets K^3-1-k for k = centre-1 .. 0: the same pairs, in and out swapped, then
    # sorted by output row like every offset of every map.
    mirror_bounds = _prefix(half_counts[::-1])
    mirror_in, mirror_out = (
        sort_by_out(
            torch.cat(
                [out_half[half_bounds[k] : half_bounds[k + 1]] for k in reversed(range(centre))]
            ),
            torch.cat(
                [in_half[half_bounds[k] : half_bounds[k + 1]] for k in reversed(range(centre))]
            ),
            mirror_bounds,
            coords.shape[0],
        )
        if centre
        else (in_half, out_half)
    )
    return _symmetric_map(
        torch.cat([in_half, mirror_in]) if centre else in_half,
        torch.cat([out_half, mirror_out]) if centre else out_half,
        half_counts,
        kernel_size,
        coords.shape[0],
    )


def submanifold_needs_table(device: torch.device, kernel_size: int, dilation: int = 1) -> bool:
    """Whether submanifold_map looks coordinates up in a hash table (else it needs none): a 1x1
    map is the identity alone, and the CPU builds kernel-3 maps without a table."""
    if kernel_size == 1:
        return False
    return not (torch.device(device).type == "cpu" and kernel_size == 3 and dilation == 1)
