"""The grouped dataflow of sparse_conv (kernels/engine.py): the plan's launches
(kernels/grouping.py) gathered into buffers, one mm or bmm each, the partial sums scatter-added
into the output, chunk by chunk under the memory cap (kernels/chunking.py); and the weight
gradients the same way.

- CPU: within one offset the output rows are distinct, so each offset's scatter runs in
  parallel without atomics; every output row adds its offsets in plan order (bitwise
  reproducible for any thread count).
- CUDA: per chunk of launches, one gather, the matmuls, one scatter: float atomics by default,
  or ordered by output row (CSR) with no float atomics when deterministic. fp16 accumulates
  scatters in an fp32 copy of the output.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .chunking import Chunk, Workspace, chunks
from .grouping import ExecutionPlan
from .rows import gather_rows, scatter_add_rows, scatter_add_unique


@dataclass(frozen=True)
class Run:
    """How one sparse_conv call executes (from its EngineConfig)."""

    deterministic: bool
    max_rows: int  # buffer rows per chunk under the memory cap
    workspace: Workspace | None  # reused scratch in inference, None under autograd


def _matmul(gathered: torch.Tensor, weight: torch.Tensor, height: int, out: torch.Tensor):
    """One piece: its [n*height, Cin] rows times the weights of its n offsets (weight
    [Cin, Cout] for one offset, [n, Cin, Cout] for several) -> out [n*height, Cout]."""
    if weight.dim() == 2:
        torch.mm(gathered, weight, out=out)
    else:
        n = weight.shape[0]
        torch.bmm(gathered.view(n, height, -1), weight, out=out.view(n, height, -1))


def _scratch(workspace, chunk_list, max_rows, cin, cout, src):
    """The gather and partial buffers for the largest chunk (reused across calls when a
    workspace is given)."""
    rows = max(c.rows for c in chunk_list)
    ws = workspace or Workspace()
    return (
        ws.get(0, rows, cin, src.dtype, src.device, max_rows),
        ws.get(1, rows, cout, src.dtype, src.device, max_rows),
    )


def _run_chunks(
    src,
    weight,
    plan: ExecutionPlan,
    dst,
    src_idx,
    dst_idx,
    scatter,
    max_rows: int,
    per_launch: bool,
    workspace,
) -> None:
    """Gather -> mm/bmm -> scatter, chunk by chunk, in the plan's row order. scatter(partial,
    chunk) adds a chunk's partial sums into dst."""
    chunk_list = chunks(plan, max_rows, per_launch)
    gathered_all, partial_all = _scratch(
        workspace, chunk_list, max_rows, weight.shape[1], weight.shape[2], src
    )
    stack = None  # the weights in launch order, made at the first piece of several offsets
    for chunk in chunk_list:
        lo, hi = chunk.start, chunk.start + chunk.rows
        gathered = gather_rows(src, src_idx[lo:hi], gathered_all[: chunk.rows])
        partial = partial_all[: chunk.rows]
        for piece in chunk.pieces:
            rows = slice(piece.start - lo, piece.start - lo + piece.rows)
            n = len(piece.kernel_indices)
            if n == 1:
                w = weight[piece.kernel_indices[0]]
            else:
                if stack is None:
                    stack = weight.index_select(0, plan.kernel_order_on(weight.device))
                w = stack[piece.stack_at : piece.stack_at + n]
            _matmul(gathered[rows], w, piece.height, partial[rows])
        scatter(partial, chunk)


def _scatter_mode(device: torch.device, deterministic: bool) -> str:
    """CPU: per offset without atomics ("unique"); CUDA: ordered ("csr") or float atomics."""
    if device.type == "cpu":
        return "unique"
    return "csr" if deterministic else "atomic"


def _launches(
    src,
    weight,
    plan: ExecutionPlan,
    dst,
    transposed: bool,
    deterministic: bool,
    max_rows: int,
    workspace,
) -> None:
    """The plan's launches added into dst, in chunks under the memory cap."""
    src_idx, dst_idx = (
        (plan.scatter_idx, plan.gather_idx) if transposed else (plan.gather_idx, plan.scatter_idx)
    )
    mode = _scatter_mode(src.device, deterministic)
    if mode == "unique":  # one offset's output rows are distinct: no atomics, any thread count

        def scatter(partial, chunk: Chunk):
            for piece in chunk.pieces:
                for _, first, rows in piece.segments():
                    part = partial[first - chunk.start : first - chunk.start + rows]
                    scatter_add_unique(part, dst, dst_idx[first : first + rows])

        _run_chunks(src, weight, plan, dst, src_idx, dst_idx, scatter, max_rows, True, workspace)
        return
    acc = dst.float() if dst.dtype == torch.float16 else dst
    csr = (plan.gather_csr if transposed else plan.scatter_csr) if mode == "csr" else None

    def scatter(partial, chunk: Chunk):  # type: ignore[no-redef]
        idx = dst_idx[chunk.start : chunk.start + chunk.rows]
        scatter_add_rows(partial, acc, idx, csr, chunk.start)

    _run_chunks(src, weight, plan, dst, src_idx, dst_idx, scatter, max_rows, False, workspace)
    if acc is not dst:
        dst.copy_(acc)


def weight_grads(feats, grad_out, weight, plan: ExecutionPlan, max_rows: int) -> torch.Tensor:
    """dW[k] = (gathered inputs of k)^T @ (gathered output grads of k), chunk by chunk under the
    memory cap; padding rows are zero."""
    grad_w = torch.zeros_like(weight)
    for chunk in chunks(plan, max_rows):
        lo, hi = chunk.start, chunk.start + chunk.rows
        a_all = gather_rows(feats, plan.gather_idx[lo:hi])  # [rows, Cin]
        g_all = gather_rows(grad_out, plan.scatter_idx[lo:hi])  # [rows, Cout]
        for piece in chunk.pieces:
            n, h = len(piece.kernel_indices), piece.height
            rows = slice(piece.start - lo, piece.start - lo + piece.rows)
            a, g = a_all[rows].view(n, h, -1), g_all[rows].view(n, h, -1)
            grad_w[list(piece.kernel_indices)] += torch.bmm(a.transpose(1, 2), g)
    if plan.identity is not None:
        grad_w[plan.identity] += feats.t() @ grad_out
    return grad_w


def grouped_conv(src, weight, plan, transposed: bool, run: Run, bias, relu, residual):
    """The grouped dataflow of a whole conv: one mm for the identity offset, the launches, then
    the epilogue (+ bias + residual, then ReLU, in place)."""
    if plan.identity is not None:
        dst = torch.mm(src, weight[plan.identity])  # [N, Cout]
    else:
        dst = src.new_zeros(plan.num_in if transposed else plan.num_out, weight.shape[2])
    if plan.rows:
        _launches(
            src, weight, plan, dst, transposed, run.deterministic, run.max_rows, run.workspace
        )
    if bias is not None:
        dst += bias
    if residual is not None:
        dst += residual
    return dst.relu_() if relu else dst
