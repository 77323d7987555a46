"""Adaptive grouping of a kernel map's offsets into matmul launches (TorchSparse, MLSys 2022).

- The identity offset (stride-1 centre) is one plain mm over all rows: no gather, no scatter.
- Symmetric offset pairs (k, K^3-1-k) have equal counts and always share one bmm, unpadded.
- The remaining units (pairs, or single offsets of a strided map), taken largest first, form
  groups: a group grows while its redundant-computation ratio 1 - sum(rows) / (n * max(rows))
  stays within `epsilon`. A group whose largest map is below `S` runs as one padded bmm;
  otherwise each of its units runs on its own.
  S = 0 is separate computation; epsilon = 1 with S = inf is dense (one padded bmm).

A plan fixes the buffer layout: launch after launch, each offset's rows padded to the launch
height. gather_idx / scatter_idx name the input / output row of every buffer row (-1 = padding).
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass, field

import torch

from . import backend
from .kmap import KernelMap


@dataclass(frozen=True)
class Launch:
    kernel_indices: tuple[int, ...]  # offsets stacked in this launch (one -> mm, several -> bmm)
    height: int  # rows per offset (the largest map of the launch)
    start: int  # first buffer row

    @property
    def rows(self) -> int:
        return len(self.kernel_indices) * self.height


def redundancy(total: int, maps: int, largest: int) -> float:
    """Share of padded rows when `maps` maps of `total` rows are each padded to the largest."""
    return 1.0 - total / (maps * largest)


def plan_launches(kmap: KernelMap, epsilon: float, threshold: float) -> list[Launch]:
    counts = kmap.counts
    volume = kmap.kernel_volume
    units: list[tuple[int, ...]]
    if kmap.symmetric:
        units = [(k, volume - 1 - k) for k in range(volume // 2) if counts[k] > 0]
    else:
        units = [(k,) for k in range(volume) if k != kmap.identity and counts[k] > 0]
    units.sort(key=lambda u: -counts[u[0]])  # stable: ties stay in kernel order
    # Every offset of a unit has its unit's count (a symmetric pair's two are equal), and units
    # come largest first, so a group's largest map is its first unit's, and the redundancy of
    # the group with one more unit follows from its running total and size.
    groups: list[list[tuple[int, ...]]] = []
    total = size = 0
    for unit in units:
        rows = counts[unit[0]]
        if groups:
            largest = counts[groups[-1][0][0]]
            grown_total, grown_size = total + rows * len(unit), size + len(unit)
            if redundancy(grown_total, grown_size, largest) <= epsilon:
                groups[-1].append(unit)
                total, size = grown_total, grown_size
                continue
        groups.append([unit])
        total, size = rows * len(unit), len(unit)
    launches: list[Launch] = []
    start = 0
    for group in groups:
        height = counts[group[0][0]]
        if len(group) > 1 and height < threshold:
            launches.append(Launch(tuple(k for u in group for k in u), height, start))
            start += sum(len(u) for u in group) * height
            continue
        for unit in group:
            h = counts[unit[0]]
            launches.append(Launch(unit, h, start))
            start += len(unit) * h
    return launches


@dataclass(frozen=True, eq=False)
class ExecutionPlan:
    launches: tuple[Launch, ...]
    num_in: int
    num_out: int
    identity: int | None
    # the map, weakly: the map caches its plans, and a strong reference back would make a cycle
    # that only the cyclic GC frees (each frame's maps, plans and index tensors left on the heap
    # until then: the heap grew by a frame's worth a request and later ones faulted in fresh pages)
    kmap_ref: weakref.ref = field(repr=False)
    fused: bool = False  # CPU: run fused gather-GEMM-scatter over the map instead of launches
    # per-plan caches: chunks (kernels/chunking.py) and kernel_order_on
    chunk_cache: dict = field(default_factory=dict, repr=False)

    @property
    def kmap(self) -> KernelMap:
        kmap = self.kmap_ref()
        if kmap is None:
            raise RuntimeError("this plan's kernel map is gone (a plan lives as long as its map)")
        return kmap

    @property
    def rows(self) -> int:
        """Rows of the padded buffer the launches run on."""
        return sum(launch.rows for launch in self.launches)

    @functools.cached_property
    def _buffer_idx(self) -> tuple[torch.Tensor, torch.Tensor]:
        gather_idx = torch.full((self.rows + 1,), -1, dtype=torch.int32, device=self.kmap.device)
        scatter_idx = torch.full_like(gather_idx, -1)
        if self.kmap.device.type == "cpu":
            _fill_by_offset(self, gather_idx, scatter_idx)
        else:
            _fill_at_once(self, gather_idx, scatter_idx)
        return gather_idx[: self.rows], scatter_idx[: self.rows]

    @property
    def gather_idx(self) -> torch.Tensor:
        """int32 [rows]: input row of each buffer row, -1 for padding (built on first use; the
        fused CPU dataflow walks the map itself and never needs it)."""
        return self._buffer_idx[0]

    @property
    def scatter_idx(self) -> torch.Tensor:
        """int32 [rows]: output row of each buffer row, -1 for padding."""
        return self._buffer_idx[1]

    @functools.cached_property
    def kernel_order(self) -> torch.Tensor:
        """int32 offsets in launch order (the grouped dataflow's weight stack)."""
        order = [k for launch in self.launches for k in launch.kernel_indices]
        return torch.tensor(order, dtype=torch.int32)

    @functools.cached_property
    def fused_order(self) -> torch.Tensor:
        """int32 offsets in kernel order: what the fused CPU kernels walk, adding each output
        row's offsets in this order. Not launch order: that follows the maps' sizes, which a
        batch sums over its frames, so a frame's rounding (and, in bf16 or int8, some of its
        labels) depended on the frames batched with it."""
        return torch.sort(self.kernel_order).values

    def kernel_order_on(self, device: torch.device) -> torch.Tensor:
        """kernel_order on `device`, uploaded once per plan (the grouped dataflow stacks a
        conv's weights in launch order with it: one index_select, not one per launch)."""
        key = ("kernel_order", device)
        if key not in self.chunk_cache:
            self.chunk_cache[key] = self.kernel_order.to(device)
        return self.chunk_cache[key]

    @property
    def bounds(self) -> torch.Tensor:
        return self.kmap.bounds_tensor

    @functools.cached_property
    def scatter_csr(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Buffer rows grouped by output row, in buffer order: (ptr [num_out + 1], rows)."""
        return csr_by_key(self.scatter_idx, self.num_out)

    @functools.cached_property
    def gather_csr(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Buffer rows grouped by input row (the backward pass scatters there)."""
        return csr_by_key(self.gather_idx, self.num_in)


def _fill_by_offset(plan: ExecutionPlan, gather_idx, scatter_idx) -> None:
    """Buffer rows offset by offset: two row copies per offset (memcpy on the CPU, where this
    is 2.6-5x faster than _fill_at_once: torch's index_put is slow there)."""
    for launch in plan.launches:
        for j, k in enumerate(launch.kernel_indices):
            ins, outs = plan.kmap.entries(k)
            lo = launch.start + j * launch.height
            gather_idx[lo : lo + len(ins)] = ins
            scatter_idx[lo : lo + len(outs)] = outs


def _fill_at_once(plan: ExecutionPlan, gather_idx, scatter_idx) -> None:
    """Every map entry of a launched offset written to its buffer row in a handful of ops,
    whatever the number of offsets (on CUDA, where _fill_by_offset's two slices and two copies
    per offset were most of a frame's host time on the H200). gather_idx / scatter_idx have one
    spare row past the buffer, where the entries of offsets in no launch (the identity, empty
    ones) land."""
    kmap = plan.kmap
    total = kmap.bounds[-1]
    # per offset: buffer row minus map position (row = entry position + shift); past the
    # spare row for offsets in no launch
    shift = [plan.rows + total] * kmap.kernel_volume
    for launch in plan.launches:
        for j, k in enumerate(launch.kernel_indices):
            shift[k] = launch.start + j * launch.height - kmap.bounds[k]
    entries = [hi - lo for lo, hi in zip(kmap.bounds[:-1], kmap.bounds[1:])]
    per_offset = torch.tensor([shift, entries], dtype=torch.int64).to(kmap.device)
    row = torch.arange(total, device=kmap.device) + torch.repeat_interleave(
        per_offset[0], per_offset[1], output_size=total
    )
    row.clamp_(max=plan.rows)  # the spare row
    gather_idx[row] = kmap.in_idx
    scatter_idx[row] = kmap.out_idx


def build_plan(
    kmap: KernelMap, epsilon: float, threshold: float, fused: bool = False
) -> ExecutionPlan:
    """The plan for (epsilon, S), cached on the map so every layer at this level reuses it."""
    key = (float(epsilon), float(threshold), fused)
    if key not in kmap.plans:
        kmap.plans[key] = ExecutionPlan(
            tuple(plan_launches(kmap, epsilon, threshold)),
            kmap.num_in,
            kmap.num_out,
            kmap.identity,
            weakref.ref(kmap),
            fused,
        )
    return kmap.plans[key]


def csr_by_key(keys: torch.Tensor, num_keys: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stable grouping of row positions by key (keys < 0 skipped): (ptr int64, rows int32)."""
    if keys.device.type == "cpu":
        ptr = torch.empty(num_keys + 1, dtype=torch.int64)
        rows = torch.empty(int((keys >= 0).sum()), dtype=torch.int32)
        backend.call("csr_by_key", keys.device, keys, keys.numel(), num_keys, ptr, rows)
        return ptr, rows
    return _csr_by_key_torch(keys, num_keys)


def _csr_by_key_torch(keys: torch.Tensor, num_keys: int) -> tuple[torch.Tensor, torch.Tensor]:
    """csr_by_key on CUDA, in torch ops (on any device: the tests run it on the CPU too)."""
    valid = keys >= 0
    kept, over = torch.stack([valid.sum(), (keys >= num_keys).sum()]).tolist()  # one sync
    if over:
        backend.refuse("csr_by_key", keys.device, f"{over} keys not below {num_keys}")
    sort_keys = torch.where(valid, keys.long(), num_keys)
    order = torch.sort(sort_keys, stable=True).indices
    counts = torch.bincount(keys[valid].long(), minlength=num_keys)
    ptr = torch.zeros(num_keys + 1, dtype=torch.int64, device=keys.device)
    ptr[1:] = counts.cumsum(0)
    return ptr, order[:kept].to(torch.int32)
