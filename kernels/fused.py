"""What the fused CPU kernels (csrc/fused_cpu.cpp, fused_bf16_cpu.cpp, fused_int8_cpu.cpp) take
after their inputs and weights: one walk over the map (csrc/fused_driver.h), the same for the
three precisions."""

from __future__ import annotations

import torch

from . import deferred
from .grouping import ExecutionPlan
from .kmap import KernelMap


def fused_output(num_dst: int, cout: int) -> torch.Tensor:
    """The fp32 output [num_dst, cout], uninitialised: the fused kernels store each row first
    (the identity offset) or clear it themselves, block by block while it is in cache."""
    return torch.empty(num_dst, cout)


def walk_args(
    kmap: KernelMap,
    plan: ExecutionPlan,
    bias,
    residual,
    relu: bool,
    dst: torch.Tensor | None,
    num_dst: int | None = None,
) -> tuple:
    """The map, offset order, identity offset, epilogue and output arguments of a fused conv
    (kmap: the plan's map, or its transpose; entries sorted by output row). dst None (NULL:
    the int8 conv that only quantizes its output) needs num_dst, its rows."""
    order = plan.fused_order
    return (
        kmap.in_idx,
        kmap.out_idx,
        plan.bounds,
        order,
        order.numel(),
        -1 if plan.identity is None else plan.identity,
        None if bias is None else bias.float().contiguous(),
        None if residual is None else deferred.contiguous(residual, torch.float32),
        int(relu),
        dst.shape[0] if dst is not None else num_dst,
        dst,
    )
