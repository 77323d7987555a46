"""The conv as an autograd function, out[q] = sum over map entries (p, q, k) of feats[p] @ W[k],
and its backward: kernels/engine.py's sparse_conv runs every conv here that the CPU's bf16 and
int8 inference paths (kernels/bf16.py, kernels/int8.py) do not take.

- CPU, "fused" dataflow (the tuned default for fp32): one C++ kernel multiplies tiles of map
  entries straight from the input rows and adds them into the output rows, each thread owning a
  range of output rows, walked in L2-sized blocks with every offset per block; the identity
  offset is computed there too, as each row's first contribution (csrc/fused_cpu.cpp).
- CPU, "grouped" dataflow (f64, odd channel counts, or when tuned so): launch by launch with
  cache-sized buffers (kernels/grouped.py); within one offset the output rows are distinct, so
  each offset's scatter runs in parallel without atomics.
  Either way every output row adds its offsets in plan order: bitwise reproducible, for any
  thread count.
- CUDA: the grouped dataflow, per chunk of launches one gather, the matmuls, one scatter. The
  default scatter uses float atomics; EngineConfig(deterministic=True) switches to a scatter
  ordered by output row (CSR) with no float atomics. fp16 accumulates scatters in an fp32 copy
  of the output.
"""

from __future__ import annotations

import torch

from . import backend, deferred
from .fused import fused_output, walk_args
from .grouped import Run, grouped_conv, weight_grads
from .grouping import ExecutionPlan


def _fused_conv(
    src, weight, plan: ExecutionPlan, transposed: bool, bias=None, relu=False, residual=None
) -> torch.Tensor | None:
    """CPU fused gather-GEMM-scatter (csrc/fused_cpu.cpp), offsets in plan order, the identity
    offset included (computed in the kernel, so no separate mm and no zeroed output). None where
    it does not apply (not fp32, or channels not a multiple of the vector width)."""
    lib = backend.library("cpu")
    if src.dtype != torch.float32 or weight.shape[2] % lib.ls_fused_lanes_cpu() != 0:
        return None
    kmap = plan.kmap.transposed if transposed else plan.kmap  # entries sorted by output
    dst = fused_output(plan.num_in if transposed else plan.num_out, weight.shape[2])
    backend.call(
        "fused_conv_f32",
        src.device,
        src,
        src.shape[1],
        weight,
        weight.shape[2],
        *walk_args(kmap, plan, bias, residual, relu, dst),
    )
    return dst


def _conv(src, weight, plan, transposed: bool, run: Run, epilogue=None) -> torch.Tensor:
    """The whole conv (transposed: grads flow out -> in): the identity offset, if any (inside
    the fused CPU kernel, else one mm), plus the other offsets by the plan's dataflow; then the
    epilogue (bias or None, relu, residual or None): + bias + residual, then ReLU, inside the
    fused kernel or in place afterwards."""
    bias, relu, residual = epilogue or (None, False, None)
    if src.device.type == "cpu" and plan.fused:
        dst = _fused_conv(src, weight, plan, transposed, bias, relu, residual)
        if dst is not None:
            return dst
    with deferred.eager():  # torch reads the rows: kernels that made them have run
        return grouped_conv(src, weight, plan, transposed, run, bias, relu, residual)


class _SparseConvFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, feats, weight, plan: ExecutionPlan, run: Run, epilogue):
        feats, weight = feats.contiguous(), weight.contiguous()
        out = _conv(feats, weight, plan, False, run, epilogue)  # [N, Cout]
        ctx.save_for_backward(feats, weight)
        # the map too: a plan holds it weakly, and the backward pass may come after the sparse
        # tensors that held it are gone
        ctx.plan, ctx.kmap, ctx.run = plan, plan.kmap, run
        return out

    @staticmethod
    def backward(ctx, grad_out):
        feats, weight = ctx.saved_tensors
        plan: ExecutionPlan = ctx.plan
        grad_out = grad_out.contiguous()
        grad_feats = grad_weight = None
        if ctx.needs_input_grad[0]:
            w_t = weight.transpose(1, 2).contiguous()  # [K, Cout, Cin]
            grad_feats = _conv(grad_out, w_t, plan, True, ctx.run)
        if ctx.needs_input_grad[1]:
            grad_weight = weight_grads(feats, grad_out, weight, plan, ctx.run.max_rows)
        return grad_feats, grad_weight, None, None, None
