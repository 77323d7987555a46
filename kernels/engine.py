"""Grouped gather-matmul-scatter: out[q] = sum over map entries (p, q, k) of feats[p] @ W[k].

Weight-stationary: the identity offset is one mm over all rows; every other launch of the plan
(kernels/grouping.py) gathers its input rows into a buffer, runs one mm or bmm, and the partial
sums are scatter-added into the output.
- CPU, "fused" dataflow (the tuned default for fp32): one C++ kernel multiplies tiles of map
  entries straight from the input rows and adds them into the output rows, each thread owning a
  range of output rows, walked in L2-sized blocks with every offset per block; the identity
  offset is computed there too, as each row's first contribution (csrc/fused_cpu.cpp).
- CPU, "grouped" dataflow (f64, odd channel counts, or when tuned so): launch by launch with
  cache-sized buffers; within one offset the output rows are distinct, so each offset's scatter
  runs in parallel without atomics.
  Either way every output row adds its offsets in plan order: bitwise reproducible, for any
  thread count.
- CUDA: one gather, the matmuls, one scatter. The default scatter uses float atomics;
  EngineConfig(deterministic=True) switches to a scatter ordered by output row (CSR) with no
  float atomics. fp16 accumulates scatters in fp32.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch

from . import backend
from .grouping import ExecutionPlan, Launch, build_plan
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
    precision: str = "fp32"  # CPU inference: "fp32" or "bf16" (kernels/precision.py resolves auto)
    grouping: GroupingTable = field(default_factory=GroupingTable.load_default)
    workspace: Workspace = field(default_factory=Workspace, compare=False, repr=False)

    def plan(self, kmap: KernelMap, cin: int, cout: int, device: torch.device) -> ExecutionPlan:
        epsilon, threshold, dataflow = self.grouping.choose(device.type, kmap.kernel_volume,
                                                            cin, cout, self.precision)
        return build_plan(kmap, epsilon, threshold, fused=dataflow == "fused")


def gather_rows(src: torch.Tensor, idx: torch.Tensor, dst: torch.Tensor | None = None):
    """dst[i] = src[idx[i]], zero rows where idx < 0."""
    src = src.contiguous()
    if dst is None:
        dst = torch.empty(idx.numel(), src.shape[1], dtype=src.dtype, device=src.device)
    backend.call(f"gather_rows_{backend.DTYPE_SUFFIX[src.dtype]}", src.device, src, src.shape[0],
                 src.shape[1], idx, idx.numel(), dst)
    return dst


def scatter_add_rows(src: torch.Tensor, dst: torch.Tensor, idx: torch.Tensor,
                     csr: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
    """dst[idx[i]] += src[i] (idx < 0 skipped). With `csr` (ptr, rows) the sums run in a fixed
    order; without it (CUDA only) float atomics are used. Returns dst."""
    suffix = backend.DTYPE_SUFFIX[src.dtype]
    c = src.shape[1]
    if csr is not None:
        ptr, rows = csr
        backend.call(f"scatter_add_csr_{suffix}", src.device, src, c, ptr, rows, dst.shape[0], dst)
        return dst
    acc = dst.float() if src.dtype == torch.float16 else dst
    backend.call(f"scatter_add_atomic_{suffix}", src.device, src, src.shape[0], c, idx, acc)
    if acc is not dst:
        dst.copy_(acc)
    return dst


def scatter_add_unique(src: torch.Tensor, dst: torch.Tensor, idx: torch.Tensor) -> None:
    """dst[idx[i]] += src[i] where the non-negative idx are distinct (one kernel offset's rows):
    no atomics, no ordering needed (CPU)."""
    backend.call(f"scatter_add_unique_{backend.DTYPE_SUFFIX[src.dtype]}", src.device, src,
                 src.shape[0], src.shape[1], idx, dst)


def _matmul(buffer: torch.Tensor, weight: torch.Tensor, launch: Launch, out: torch.Tensor) -> None:
    """One launch: [n*h, Cin] rows times the weights of its n offsets -> out [n*h, Cout]."""
    n, h = len(launch.kernel_indices), launch.height
    if n == 1:
        torch.mm(buffer, weight[launch.kernel_indices[0]], out=out)
    else:
        w = weight[list(launch.kernel_indices)]                         # [n, Cin, Cout]
        torch.bmm(buffer.view(n, h, -1), w, out=out.view(n, h, -1))


def _stream_launches(src, weight, plan: ExecutionPlan, dst, src_idx, dst_idx,
                     workspace: Workspace | None) -> None:
    """CPU path: launch by launch, gather -> mm/bmm -> scatter each offset's rows (distinct
    outputs, so no atomics). Buffers hold one launch, small enough to stay in cache; every output
    row receives its offsets in plan order, for any thread count."""
    biggest = max((launch.rows for launch in plan.launches), default=0)
    cin, cout = weight.shape[1], weight.shape[2]
    ws = workspace or Workspace()
    gathered_all = ws.get(0, biggest, cin, src.dtype, src.device)
    partial_all = ws.get(1, biggest, cout, src.dtype, src.device)
    for launch in plan.launches:
        lo, hi = launch.start, launch.start + launch.rows
        gathered = gather_rows(src, src_idx[lo:hi], gathered_all[: launch.rows])
        partial = partial_all[: launch.rows]
        _matmul(gathered, weight, launch, partial)
        for j in range(len(launch.kernel_indices)):
            rows = slice(j * launch.height, (j + 1) * launch.height)
            scatter_add_unique(partial[rows], dst, dst_idx[lo:hi][rows])


def _buffered_launches(src, weight, plan: ExecutionPlan, dst, src_idx, dst_idx, csr) -> None:
    """CUDA path: one gather of every launch's rows, the matmuls, one scatter (ordered by `csr`
    in deterministic mode, float atomics otherwise)."""
    gathered = gather_rows(src, src_idx)                                # [R, Cin]
    partial = torch.empty(plan.rows, weight.shape[2], dtype=src.dtype, device=src.device)
    for launch in plan.launches:
        rows = slice(launch.start, launch.start + launch.rows)
        _matmul(gathered[rows], weight, launch, partial[rows])
    scatter_add_rows(partial, dst, dst_idx, csr)


def _weight_grads(feats, grad_out, weight, plan: ExecutionPlan) -> torch.Tensor:
    """dW[k] = (gathered inputs of k)^T @ (gathered output grads of k); padding rows are zero."""
    grad_w = torch.zeros_like(weight)
    for launch in plan.launches:
        n, h = len(launch.kernel_indices), launch.height
        lo, hi = launch.start, launch.start + launch.rows
        a = gather_rows(feats, plan.gather_idx[lo:hi]).view(n, h, -1)    # [n, h, Cin]
        g = gather_rows(grad_out, plan.scatter_idx[lo:hi]).view(n, h, -1)  # [n, h, Cout]
        grad_w[list(launch.kernel_indices)] = torch.bmm(a.transpose(1, 2), g)
    if plan.identity is not None:
        grad_w[plan.identity] += feats.t() @ grad_out
    return grad_w


def _fused_conv(src, weight, plan: ExecutionPlan, transposed: bool, bias=None, relu=False,
                residual=None) -> torch.Tensor | None:
    """CPU fused gather-GEMM-scatter (csrc/fused_cpu.cpp), offsets in plan order, the identity
    offset included (computed in the kernel, so no separate mm and no zeroed output). None where
    it does not apply (not fp32, or channels not a multiple of the vector width)."""
    lib = backend.library("cpu")
    if src.dtype != torch.float32 or weight.shape[2] % lib.ls_fused_lanes_cpu() != 0:
        return None
    kmap = plan.kmap.transposed if transposed else plan.kmap    # entries sorted by output
    order = plan.kernel_order
    num_dst = plan.num_in if transposed else plan.num_out
    identity = -1 if plan.identity is None else plan.identity
    dst = src.new_empty(num_dst, weight.shape[2]) if identity >= 0 else \
        src.new_zeros(num_dst, weight.shape[2])
    backend.call("fused_conv_f32", src.device, src, src.shape[1], weight, weight.shape[2],
                 kmap.in_idx, kmap.out_idx, plan.bounds, order, order.numel(), identity,
                 None if bias is None else bias.contiguous(),
                 None if residual is None else residual.contiguous(), int(relu), num_dst, dst)
    return dst


def _conv(src, weight, plan, transposed: bool, deterministic: bool, workspace,
          epilogue=None) -> torch.Tensor:
    """The whole conv (transposed: grads flow out -> in): the identity offset, if any (inside
    the fused CPU kernel, else one mm), plus the other offsets by the plan's dataflow; then the
    epilogue (bias or None, relu, residual or None): + bias + residual, then ReLU, inside the
    fused kernel or in place afterwards."""
    bias, relu, residual = epilogue or (None, False, None)
    if src.device.type == "cpu" and plan.fused:
        dst = _fused_conv(src, weight, plan, transposed, bias, relu, residual)
        if dst is not None:
            return dst
    dst = _unfused_conv(src, weight, plan, transposed, deterministic, workspace)
    if bias is not None:
        dst += bias
    if residual is not None:
        dst += residual
    return dst.relu_() if relu else dst


def _unfused_conv(src, weight, plan, transposed: bool, deterministic: bool, workspace):
    """The identity offset as one mm (or zeros), plus the plan's launches."""
    if plan.identity is not None:
        dst = torch.mm(src, weight[plan.identity])                      # [N, Cout]
    else:
        dst = src.new_zeros(plan.num_in if transposed else plan.num_out, weight.shape[2])
    if not plan.rows:
        return dst
    src_idx, dst_idx = (plan.scatter_idx, plan.gather_idx) if transposed else \
        (plan.gather_idx, plan.scatter_idx)
    if src.device.type == "cpu":
        _stream_launches(src, weight, plan, dst, src_idx, dst_idx, workspace)
    else:
        csr = (plan.gather_csr if transposed else plan.scatter_csr) if deterministic else None
        _buffered_launches(src, weight, plan, dst, src_idx, dst_idx, csr)
    return dst


class _SparseConvFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, feats, weight, plan: ExecutionPlan, deterministic: bool,
                workspace: Workspace | None, epilogue):
        feats, weight = feats.contiguous(), weight.contiguous()
        out = _conv(feats, weight, plan, False, deterministic, workspace, epilogue)  # [N, Cout]
        ctx.save_for_backward(feats, weight)
        ctx.plan, ctx.deterministic = plan, deterministic
        return out

    @staticmethod
    def backward(ctx, grad_out):
        feats, weight = ctx.saved_tensors
        plan: ExecutionPlan = ctx.plan
        grad_out = grad_out.contiguous()
        grad_feats = grad_weight = None
        if ctx.needs_input_grad[0]:
            w_t = weight.transpose(1, 2).contiguous()                   # [K, Cout, Cin]
            grad_feats = _conv(grad_out, w_t, plan, True, ctx.deterministic, None)
        if ctx.needs_input_grad[1]:
            grad_weight = _weight_grads(feats, grad_out, weight, plan)
        return grad_feats, grad_weight, None, None, None, None


def sparse_conv(feats: torch.Tensor, weight: torch.Tensor, kmap: KernelMap,
                config: EngineConfig, bias: torch.Tensor | None = None, relu: bool = False,
                residual: torch.Tensor | None = None) -> torch.Tensor:
    """feats [num_in, Cin], weight [K^3, Cin, Cout] -> [num_out, Cout] (autograd-aware), plus
    bias [Cout] and residual [num_out, Cout] when given, then ReLU when asked (all fused into
    the CPU kernel's epilogue in inference)."""
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
    if bias is not None and (bias.shape != (weight.shape[2],) or bias.dtype != weight.dtype):
        raise ValueError(f"bias must be [{weight.shape[2]}] {weight.dtype}, got "
                         f"{tuple(bias.shape)} {bias.dtype}")
    if residual is not None and (residual.shape != (kmap.num_out, weight.shape[2])
                                 or residual.dtype != weight.dtype):
        raise ValueError(f"residual must be [{kmap.num_out}, {weight.shape[2]}] {weight.dtype}, "
                         f"got {tuple(residual.shape)} {residual.dtype}")
    plan = config.plan(kmap, weight.shape[1], weight.shape[2], feats.device)
    extras = [t for t in (bias, residual) if t is not None]
    grads = torch.is_grad_enabled() and any(t.requires_grad for t in [feats, weight, *extras])
    if not grads and config.precision == "bf16" and feats.device.type == "cpu" \
            and feats.dtype == torch.float32:
        from .bf16 import conv_bf16  # inference in bf16 (kernels/bf16.py)
        out = conv_bf16(feats.contiguous(), weight, plan, config.workspace, bias, relu, residual)
        if out is not None:
            return out
    if not grads:
        return _SparseConvFunction.apply(feats, weight, plan, config.deterministic,
                                         config.workspace, (bias, relu, residual))
    out = _SparseConvFunction.apply(feats, weight, plan, config.deterministic, None, None)
    for t in extras:
        out = out + t
    return torch.relu(out) if relu else out
