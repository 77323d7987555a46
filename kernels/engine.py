"""Grouped gather-matmul-scatter: out[q] = sum over map entries (p, q, k) of feats[p] @ W[k].

Weight-stationary: the identity offset is one mm over all rows; every other launch of the plan
(kernels/grouping.py) gathers its input rows into a buffer, runs one mm or bmm, and the partial
sums are scatter-added into the output. On the CPU the scatter always walks each output row's
contributions in buffer order (no atomics), so results are bitwise reproducible. On CUDA the
default scatter uses float atomics; EngineConfig(deterministic=True) switches to the ordered
scatter. fp16 on CUDA accumulates scatters in fp32.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch

from . import backend
from .grouping import ExecutionPlan, build_plan
from .kmap import KernelMap
from .tuning import GroupingTable


class Workspace:
    """Scratch buffers reused across inference calls (per thread, per device and dtype).

    Gather buffers of a large frame are tens of MB; allocating them fresh each call costs more in
    page faults than the matmuls (measured 17 ms for 65 MB on the CPU). Buffers are only reused
    when no autograd graph keeps them alive (inference)."""

    def __init__(self):
        self._local = threading.local()

    def get(self, slot: int, rows: int, cols: int, dtype: torch.dtype,
            device: torch.device) -> torch.Tensor:
        buffers = self._local.__dict__.setdefault("buffers", {})
        key = (slot, dtype, device)
        flat = buffers.get(key)
        if flat is None or flat.numel() < rows * cols:
            flat = torch.empty(max(rows * cols * 5 // 4, 1), dtype=dtype, device=device)
            buffers[key] = flat
        return flat[: rows * cols].view(rows, cols)


@dataclass(frozen=True)
class EngineConfig:
    """How sparse convolutions execute. Load the tuned grouping once at start-up and share it."""

    deterministic: bool = False
    grouping: GroupingTable = field(default_factory=GroupingTable.load_default)
    workspace: Workspace = field(default_factory=Workspace, compare=False, repr=False)

    def plan(self, kmap: KernelMap, cin: int, cout: int, device: torch.device) -> ExecutionPlan:
        epsilon, threshold = self.grouping.choose(device.type, kmap.kernel_volume, cin, cout)
        return build_plan(kmap, epsilon, threshold)


def gather_rows(src: torch.Tensor, idx: torch.Tensor, dst: torch.Tensor | None = None):
    """dst[i] = src[idx[i]], zero rows where idx < 0."""
    src = src.contiguous()
    if dst is None:
        dst = torch.empty(idx.numel(), src.shape[1], dtype=src.dtype, device=src.device)
    backend.call(f"gather_rows_{backend.DTYPE_SUFFIX[src.dtype]}", src.device, backend.ptr(src),
                 backend.i64(src.shape[0]), backend.i64(src.shape[1]), backend.ptr(idx),
                 backend.i64(idx.numel()), backend.ptr(dst))
    return dst


def scatter_add_rows(src: torch.Tensor, dst: torch.Tensor, idx: torch.Tensor,
                     csr: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
    """dst[idx[i]] += src[i] (idx < 0 skipped). With `csr` (ptr, rows) the sums run in a fixed
    order; without it (CUDA only) float atomics are used. Returns dst."""
    suffix = backend.DTYPE_SUFFIX[src.dtype]
    c = src.shape[1]
    if csr is not None:
        ptr, rows = csr
        backend.call(f"scatter_add_csr_{suffix}", src.device, backend.ptr(src), backend.i64(c),
                     backend.ptr(ptr), backend.ptr(rows), backend.i64(dst.shape[0]),
                     backend.ptr(dst))
        return dst
    acc = dst.float() if src.dtype == torch.float16 else dst
    backend.call(f"scatter_add_atomic_{suffix}", src.device, backend.ptr(src),
                 backend.i64(src.shape[0]), backend.i64(c), backend.ptr(idx), backend.ptr(acc))
    if acc is not dst:
        dst.copy_(acc)
    return dst


def _run_launches(buffer: torch.Tensor, weight: torch.Tensor, plan: ExecutionPlan,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """Every launch's rows of `buffer` [R, Cin] times its offsets' weights -> [R, Cout]."""
    if out is None:
        out = torch.empty(buffer.shape[0], weight.shape[2], dtype=buffer.dtype,
                          device=buffer.device)
    for launch in plan.launches:
        n, h = len(launch.kernel_indices), launch.height
        rows = slice(launch.start, launch.start + n * h)
        if n == 1:
            torch.mm(buffer[rows], weight[launch.kernel_indices[0]], out=out[rows])
        else:
            w = weight[list(launch.kernel_indices)]                     # [n, Cin, Cout]
            torch.bmm(buffer[rows].view(n, h, -1), w, out=out[rows].view(n, h, -1))
    return out


def _weight_grads(buffer: torch.Tensor, grad_buffer: torch.Tensor, weight: torch.Tensor,
                  plan: ExecutionPlan) -> torch.Tensor:
    """dW[k] = gathered inputs of k (transposed) @ gathered output grads of k."""
    grad_w = torch.zeros_like(weight)
    for launch in plan.launches:
        n, h = len(launch.kernel_indices), launch.height
        rows = slice(launch.start, launch.start + n * h)
        a = buffer[rows].view(n, h, -1).transpose(1, 2)                 # [n, Cin, h]
        grad_w[list(launch.kernel_indices)] = torch.bmm(a, grad_buffer[rows].view(n, h, -1))
    return grad_w


def _use_csr(device: torch.device, deterministic: bool) -> bool:
    return device.type == "cpu" or deterministic


class _SparseConvFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, feats, weight, plan: ExecutionPlan, deterministic: bool,
                workspace: Workspace | None):
        feats, weight = feats.contiguous(), weight.contiguous()
        if plan.identity is not None:
            out = torch.mm(feats, weight[plan.identity])                # [N, Cout]
        else:
            out = feats.new_zeros(plan.num_out, weight.shape[2])
        rows, cin, cout = plan.rows, weight.shape[1], weight.shape[2]
        scratch = (workspace.get(0, rows, cin, feats.dtype, feats.device) if workspace else None,
                   workspace.get(1, rows, cout, feats.dtype, feats.device) if workspace else None)
        buffer = gather_rows(feats, plan.gather_idx, scratch[0])        # [R, Cin]
        if plan.rows:
            partial = _run_launches(buffer, weight, plan, scratch[1])   # [R, Cout]
            csr = plan.scatter_csr if _use_csr(feats.device, deterministic) else None
            scatter_add_rows(partial, out, plan.scatter_idx, csr)
        ctx.save_for_backward(feats, weight, buffer)
        ctx.plan, ctx.deterministic = plan, deterministic
        return out

    @staticmethod
    def backward(ctx, grad_out):
        feats, weight, buffer = ctx.saved_tensors
        plan: ExecutionPlan = ctx.plan
        grad_out = grad_out.contiguous()
        grad_buffer = gather_rows(grad_out, plan.scatter_idx)           # [R, Cout]
        grad_feats = grad_weight = None
        if ctx.needs_input_grad[0]:
            w_t = weight.transpose(1, 2).contiguous()                   # [K, Cout, Cin]
            if plan.identity is not None:
                grad_feats = torch.mm(grad_out, w_t[plan.identity])
            else:
                grad_feats = grad_out.new_zeros(plan.num_in, weight.shape[1])
            if plan.rows:
                partial = _run_launches(grad_buffer, w_t, plan)         # [R, Cin]
                csr = plan.gather_csr if _use_csr(grad_out.device, ctx.deterministic) else None
                scatter_add_rows(partial, grad_feats, plan.gather_idx, csr)
        if ctx.needs_input_grad[1]:
            grad_weight = _weight_grads(buffer, grad_buffer, weight, plan)
            if plan.identity is not None:
                grad_weight[plan.identity] += feats.t() @ grad_out
        return grad_feats, grad_weight, None, None, None


def sparse_conv(feats: torch.Tensor, weight: torch.Tensor, kmap: KernelMap,
                config: EngineConfig) -> torch.Tensor:
    """feats [num_in, Cin], weight [K^3, Cin, Cout] -> [num_out, Cout] (autograd-aware)."""
    if feats.dim() != 2 or feats.shape[0] != kmap.num_in:
        raise ValueError(f"feats must be [{kmap.num_in}, Cin], got {tuple(feats.shape)}")
    if weight.dim() != 3 or weight.shape[0] != kmap.kernel_volume or weight.shape[1] != feats.shape[1]:
        raise ValueError(f"weight must be [{kmap.kernel_volume}, {feats.shape[1]}, Cout], "
                         f"got {tuple(weight.shape)}")
    if weight.dtype != feats.dtype:
        raise ValueError(f"weight dtype {weight.dtype} != feats dtype {feats.dtype}")
    if feats.dtype not in backend.DTYPE_SUFFIX or (
            feats.dtype == torch.float16 and feats.device.type != "cuda"):
        raise ValueError(f"unsupported dtype {feats.dtype} on {feats.device.type}")
    plan = config.plan(kmap, weight.shape[1], weight.shape[2], feats.device)
    inference = not (torch.is_grad_enabled() and (feats.requires_grad or weight.requires_grad))
    return _SparseConvFunction.apply(feats, weight, plan, config.deterministic,
                                     config.workspace if inference else None)
