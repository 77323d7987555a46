"""Pure-torch oracles for every kernel: slow, obvious, and the thing tests compare against."""

from __future__ import annotations

import torch

from .kmap import kernel_offsets


def brute_force_map(
    in_coords: torch.Tensor,
    out_coords: torch.Tensor,
    kernel_size: int,
    stride: int = 1,
    padding: int | None = None,
    dilation: int = 1,
) -> set[tuple[int, int, int]]:
    """All (in row, out row, kernel index) with in = out*stride + offset[k], same batch."""
    if padding is None:
        padding = kernel_size // 2
    offsets = kernel_offsets(kernel_size, padding, dilation).tolist()
    where = {tuple(c): i for i, c in enumerate(in_coords.tolist())}
    entries: set[tuple[int, int, int]] = set()
    for q, (b, x, y, z) in enumerate(out_coords.tolist()):
        for k, (dx, dy, dz) in enumerate(offsets):
            p = where.get((b, x * stride + dx, y * stride + dy, z * stride + dz))
            if p is not None:
                entries.add((p, q, k))
    return entries


def map_entries(kmap) -> set[tuple[int, int, int]]:
    """A KernelMap as a set of (in, out, k), the identity offset included."""
    entries: set[tuple[int, int, int]] = set()
    for k in range(kmap.kernel_volume):
        ins, outs = kmap.entries(k)
        entries.update((int(p), int(q), k) for p, q in zip(ins.tolist(), outs.tolist()))
    return entries


def unique_floor(coords: torch.Tensor, stride: int) -> torch.Tensor:
    """Coarse coordinates: the distinct floor(c / stride) in ascending (batch, x, y, z) order."""
    coarse = coords.clone()
    coarse[:, 1:] = torch.div(coarse[:, 1:], stride, rounding_mode="floor")
    return torch.tensor(sorted(set(map(tuple, coarse.tolist()))), dtype=torch.int32).reshape(-1, 4)


def conv_from_entries(feats: torch.Tensor, weight: torch.Tensor, entries, num_out: int):
    """out[q] += feats[p] @ weight[k] for every entry, one at a time (autograd-friendly)."""
    out = feats.new_zeros(num_out, weight.shape[2])
    for p, q, k in sorted(entries):
        out = out.index_add(0, torch.tensor([q]), (feats[p] @ weight[k])[None])
    return out


def gather_rows(src: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    out = src.new_zeros(idx.numel(), src.shape[1])
    valid = idx >= 0
    out[valid] = src[idx[valid].long()]
    return out


def scatter_add_rows(src: torch.Tensor, dst: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    valid = idx >= 0
    return dst.index_add(0, idx[valid].long(), src[valid])
