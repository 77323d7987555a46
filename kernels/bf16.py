"""bf16 inference on the CPU: inputs and weights of a sparse conv rounded to bf16, products summed
in fp32, output (with bias, residual and ReLU) in fp32 (kernels/precision.py says when it runs).

- "fused" dataflow: csrc/fused_bf16_cpu.cpp (AVX512_BF16 dot products), the same walk over the
  map as the fp32 fused kernel; needs the CPU feature (checked at run time), even Cin and Cout a
  multiple of 16. Where the CPU has AMX tiles the same walk multiplies on them
  (ls_fused_conv_bf16_tiles_cpu, csrc/amx_tiles.h) and reads the fp32 input rows themselves,
  rounding each to bf16 as it stages it for a tile: no bf16 copy of the input is made. Without
  tiles the kernel rounds the input rows into a reused bf16 buffer itself, before its walk.
- "grouped" dataflow (or where fused does not apply): the fp32 engine's launches with torch's
  bf16 matmul (oneDNN: AMX tiles where the CPU has them), which returns each launch's partial
  sums rounded to bf16; they are widened to fp32 and added into the fp32 output.

A conv with at most FP32_MAX_CIN input channels stays in fp32: it is the network's input layer,
whose inputs are raw point features (coordinates in metres, where bf16's 8-bit mantissa keeps
only 0.25 m at 50 m), and with so few products per output bf16 would save nothing.

Weights are converted once per weight tensor (and again only if it changes in place) and kept
beside it; the input rows are converted per call into a reused workspace buffer (by the fused
kernel itself, or by torch for the grouped path; not at all on tiles).
Inference only: nothing here records autograd history.
"""

from __future__ import annotations

import torch

from . import backend, deferred
from .amx import amx_tiles, tiles_fit
from .chunking import chunks
from .derived import derived
from .fused import fused_output, walk_args
from .grouping import ExecutionPlan
from .precision import fused_bf16_lanes
from .rows import gather_rows, scatter_add_unique

FP32_MAX_CIN = 8


def bf16_weights(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(plain [K, Cin, Cout] bf16, pairs [K, Cin/2, Cout, 2] bf16 or None for odd Cin), cached
    per weight tensor until it changes."""
    return derived(weight, "bf16", _bf16_copies)


def _bf16_copies(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    plain = weight.detach().to(torch.bfloat16).contiguous()
    k, cin, cout = plain.shape
    pairs = None if cin % 2 else plain.view(k, cin // 2, 2, cout).transpose(2, 3).contiguous()
    return plain, pairs


def conv_bf16(
    src: torch.Tensor,
    weight: torch.Tensor,
    plan: ExecutionPlan,
    workspace,
    bias=None,
    relu: bool = False,
    residual=None,
    memory_cap: int = 256 << 20,
) -> torch.Tensor | None:
    """The forward conv of engine.sparse_conv in bf16 (src [N, Cin] fp32 -> [num_out, Cout]
    fp32), or None where the conv stays in fp32 (Cin <= FP32_MAX_CIN). The grouped path's scratch
    stays under memory_cap bytes."""
    n, cin = src.shape
    if cin <= FP32_MAX_CIN:
        return None
    cout = weight.shape[2]
    plain, pairs = bf16_weights(weight)
    lanes = fused_bf16_lanes()
    fused = plan.fused and pairs is not None and lanes and cout % lanes == 0
    if fused and "bf16" in amx_tiles() and tiles_fit(cin * 2, cout) and src.is_contiguous():
        return _fused("fused_conv_bf16_tiles", src, pairs, plan, bias, relu, residual)
    xb = workspace.get(2, n, cin, torch.bfloat16, src.device)
    if fused:  # the kernel rounds src into xb itself: no torch op, no Python between the two
        return _fused("fused_conv_bf16", src, pairs, plan, bias, relu, residual, xb)
    with deferred.eager():  # torch reads the rows: kernels that made them have run
        xb.copy_(src)
        dst = _grouped(xb, plain, plan, workspace, rows_under_cap_bf16(memory_cap, cin, cout))
        if bias is not None:
            dst += bias
        if residual is not None:
            dst += residual
        return dst.relu_() if relu else dst


def _fused(
    op: str, x, pairs, plan: ExecutionPlan, bias, relu, residual, staged=None
) -> torch.Tensor:
    """The fused bf16 conv of the fp32 input x: fused_conv_bf16 rounds it to bf16 into staged
    (bf16, x's shape) first, in the same kernel call; on AMX tiles fused_conv_bf16_tiles rounds
    each row as it stages it for a tile."""
    cout = pairs.shape[2]
    dst = fused_output(plan.num_out, cout)
    backend.call(
        op,
        x.device,
        x,
        *(() if staged is None else (len(x), staged)),
        x.shape[1],
        pairs,
        cout,
        *walk_args(plan.kmap, plan, bias, residual, relu, dst),
    )
    return dst


def _gather_bf16(xb: torch.Tensor, idx: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out[i] = xb[idx[i]], zero rows where idx < 0."""
    if xb.shape[1] % 2 == 0:  # a row of bf16 pairs is a row of fp32 bit patterns: move those
        gather_rows(xb.view(torch.float32), idx, out.view(torch.float32))
        return out
    torch.index_select(xb, 0, idx.clamp_min(0).long(), out=out)
    out[idx < 0] = 0
    return out


def _grouped(xb, plain, plan: ExecutionPlan, workspace, max_rows: int) -> torch.Tensor:
    """The plan's launches as bf16 matmuls, in pieces of at most max_rows buffer rows (the
    memory cap; kernels/chunking.py), widened to fp32 and added into the output in plan order."""
    cout = plain.shape[2]
    if plan.identity is not None:
        dst = torch.mm(xb, plain[plan.identity]).float()
    else:
        dst = torch.zeros(plan.num_out, cout)
    if not plan.rows:
        return dst
    chunk_list = chunks(plan, max_rows, per_launch=True)
    biggest = max(piece.rows for chunk in chunk_list for piece in chunk.pieces)
    gathered_all = workspace.get(3, biggest, xb.shape[1], torch.bfloat16, xb.device)
    partial_all = workspace.get(4, biggest, cout, torch.bfloat16, xb.device)
    wide_all = workspace.get(5, biggest, cout, torch.float32, xb.device)
    for piece in (piece for chunk in chunk_list for piece in chunk.pieces):
        lo, hi = piece.start, piece.start + piece.rows
        gathered = _gather_bf16(xb, plan.gather_idx[lo:hi], gathered_all[: piece.rows])
        partial = partial_all[: piece.rows]
        n, h = len(piece.kernel_indices), piece.height
        if n == 1:
            torch.mm(gathered, plain[piece.kernel_indices[0]], out=partial)
        else:
            torch.bmm(
                gathered.view(n, h, -1),
                plain[list(piece.kernel_indices)],
                out=partial.view(n, h, -1),
            )
        wide = wide_all[: piece.rows]
        wide.copy_(partial)
        for j in range(n):
            rows = slice(j * h, (j + 1) * h)
            scatter_add_unique(wide[rows], dst, plan.scatter_idx[lo:hi][rows])
    return dst


def rows_under_cap_bf16(cap_bytes: int, cin: int, cout: int) -> int:
    """Buffer rows of the bf16 grouped path under cap_bytes: a gathered bf16 input row, a bf16
    partial row and its fp32 widening (at least 1)."""
    return max(int(cap_bytes) // (2 * cin + 6 * cout), 1)
