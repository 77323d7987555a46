"""Strided kernel maps: a level of coordinates downsampled by `stride` (kernel positions inside
each output's cell) and its map, in the conventions of kernels/kmap.py. On the CPU, rows in
ascending (batch, x, y, z) order with kernel == stride take per-column sorts and no hash table
(csrc/sorted_downsample_cpu.cpp); everything else, and everything on CUDA, inserts the parents
into a hash table and looks the inputs up.
"""

from __future__ import annotations

import torch

from . import backend
from .hashtable import (
    INT32_MAX,
    CoordHashTable,
    check_coords,
    new_error_buffer,
    raise_duplicates,
    raise_for_status,
)
from .kmap import KernelMap, _compact, _prefix, kernel_offsets


def downsample_needs_table(kernel_size: int, stride: int, padding: int = 0) -> bool:
    """Whether downsample looks the fine coordinates up in a hash table: only when kernel
    positions can reach beyond a voxel's own parent cell (kernel != stride or padding != 0)."""
    return not (kernel_size == stride and padding == 0)


def _parent_nbr(coords: torch.Tensor, out_of_row: torch.Tensor, stride: int, num_out: int):
    """nbr [stride^3, M] of a kernel == stride, padding 0 downsample: every input row feeds
    exactly its parent through its position inside the parent cell, so no look-up is needed."""
    pos = torch.remainder(coords[:, 1:], stride).long()
    k = (pos[:, 0] * stride + pos[:, 1]) * stride + pos[:, 2]
    nbr = torch.full((stride**3, num_out), -1, dtype=torch.int32, device=coords.device)
    nbr[k, out_of_row.long()] = torch.arange(len(coords), dtype=torch.int32, device=coords.device)
    return nbr, (nbr >= 0).sum(dim=1)


def _sorted_downsample_cpu(coords: torch.Tensor, stride: int):
    """(out_coords, KernelMap) of a kernel == stride downsample of sorted coords, with no hash
    table (csrc/sorted_downsample_cpu.cpp); None when the rows are not sorted."""
    n = coords.shape[0]
    out_coords = torch.empty(n, 4, dtype=torch.int32)
    in_idx = torch.empty(n, dtype=torch.int32)
    out_idx = torch.empty(n, dtype=torch.int32)
    counts = torch.empty(stride**3, dtype=torch.int64)
    num_out, applied = torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64)
    err = new_error_buffer(coords.device)
    backend.call(
        "sorted_downsample",
        coords.device,
        coords,
        n,
        stride,
        out_coords,
        in_idx,
        out_idx,
        counts,
        num_out,
        applied,
        err,
    )
    raise_for_status(err, coords)
    if not applied.item():
        return None
    m = int(num_out.item())
    kmap = KernelMap(
        in_idx=in_idx,
        out_idx=out_idx,
        bounds=_prefix(counts.tolist()),
        kernel_size=stride,
        num_in=n,
        num_out=m,
    )
    return out_coords[:m].clone(), kmap


def downsample(
    coords: torch.Tensor,
    table: CoordHashTable | None = None,
    kernel_size: int = 2,
    stride: int = 2,
    padding: int = 0,
):
    """Strided map. Outputs are the unique floor(coords / stride) in ascending (batch, x, y, z)
    order, whatever the input order (so every coarser level takes the sorted map paths).
    `table` (a hash table of coords) is only used when downsample_needs_table(); it is built
    when missing. Returns (out_coords int32 [M, 4], a hash table over them or None where none
    was needed (the CPU path for sorted rows with kernel == stride), KernelMap in -> out)."""
    check_coords(coords)
    coords = coords.contiguous()
    n, device = coords.shape[0], coords.device
    if (
        device.type == "cpu"
        and not downsample_needs_table(kernel_size, stride, padding)
        and stride <= 8
    ):
        made = _sorted_downsample_cpu(coords, stride)
        if made is not None:
            return made[0], None, made[1]
    coarse = CoordHashTable.empty(n, device, fill_value=INT32_MAX)
    slot_of_row = torch.empty(n, dtype=torch.int64, device=device)
    err = new_error_buffer(device)
    backend.call(
        "hash_insert_min",
        device,
        coords,
        n,
        stride,
        coarse.slots,
        coarse.capacity,
        slot_of_row,
        err,
    )
    raise_for_status(err, coords)
    values = coarse.values
    first = values[slot_of_row] == torch.arange(n, dtype=torch.int32, device=device)
    first_slots = slot_of_row[first.nonzero().flatten()]
    # Packed keys (unsigned, csrc/common.h) order like (batch, x, y, z); flipping the top bit
    # makes signed int64 order the same, so sorting them sorts the outputs.
    first_slots = first_slots[torch.sort(coarse.slots[first_slots, 0] ^ -(2**63)).indices]
    num_out = len(first_slots)
    out_coords = coords[values[first_slots].long()]
    out_coords[:, 1:] = torch.div(out_coords[:, 1:], stride, rounding_mode="floor")
    values[first_slots] = torch.arange(num_out, dtype=torch.int32, device=device)
    out_table = CoordHashTable(coarse.slots, num_out)
    if downsample_needs_table(kernel_size, stride, padding):
        table = table if table is not None else CoordHashTable.build(coords)
        nbr, counts = table.lookup(out_coords, stride, kernel_offsets(kernel_size, padding))
    else:
        nbr, counts = _parent_nbr(coords, values[slot_of_row], stride, num_out)
    in_idx, out_idx, count_list = _compact(nbr, counts)
    if not downsample_needs_table(kernel_size, stride, padding) and sum(count_list) != n:
        raise_duplicates(coords)  # equal rows took one (parent, position) cell: one was lost
    kmap = KernelMap(
        in_idx=in_idx,
        out_idx=out_idx,
        bounds=_prefix(count_list),
        kernel_size=kernel_size,
        num_in=n,
        num_out=num_out,
    )
    return out_coords, out_table, kmap
