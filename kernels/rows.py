"""Row gathers and scatters on our kernels (CPU and CUDA), shared by the engine and the bf16
path; the per-row argmax of the pipeline's logits (CPU)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import backend
from .derived import derived


def gather_rows(src: torch.Tensor, idx: torch.Tensor, dst: torch.Tensor | None = None):
    """dst[i] = src[idx[i]], zero rows where idx < 0."""
    src = src.contiguous()
    if dst is None:
        dst = torch.empty(idx.numel(), src.shape[1], dtype=src.dtype, device=src.device)
    backend.call(
        f"gather_rows_{backend.DTYPE_SUFFIX[src.dtype]}",
        src.device,
        src,
        src.shape[0],
        src.shape[1],
        idx,
        idx.numel(),
        dst,
    )
    return dst


def scatter_add_rows(
    src: torch.Tensor,
    dst: torch.Tensor,
    idx: torch.Tensor,
    csr: tuple[torch.Tensor, torch.Tensor] | None,
    row_lo: int = 0,
) -> torch.Tensor:
    """dst[idx[i]] += src[i] (idx < 0 skipped), src holding buffer rows [row_lo, row_lo + len).
    With `csr` (ptr, rows) of the whole buffer the sums run in a fixed order; without it (CUDA
    only) float atomics are used. dst is fp32 for an fp16 src (the caller rounds once).
    Returns dst."""
    suffix = backend.DTYPE_SUFFIX[src.dtype]
    m, c = src.shape
    if csr is not None:
        ptr, rows = csr
        backend.call(
            f"scatter_add_csr_{suffix}",
            src.device,
            src,
            c,
            ptr,
            rows,
            dst.shape[0],
            row_lo,
            row_lo + m,
            dst,
        )
    else:
        backend.call(f"scatter_add_atomic_{suffix}", src.device, src, m, c, idx, dst)
    return dst


def scatter_add_unique(src: torch.Tensor, dst: torch.Tensor, idx: torch.Tensor) -> None:
    """dst[idx[i]] += src[i] where the non-negative idx are distinct (one kernel offset's rows):
    no atomics, no ordering needed (CPU)."""
    backend.call(
        f"scatter_add_unique_{backend.DTYPE_SUFFIX[src.dtype]}",
        src.device,
        src,
        src.shape[0],
        src.shape[1],
        idx,
        dst,
    )


def argmax_rows_u8(x: torch.Tensor) -> torch.Tensor | None:
    """uint8 [N]: torch.argmax(x, dim=1) of CPU float32 logits [N, C] with C <= 256 (first of
    equal values, first NaN), one parallel pass (torch's takes about 1.5 ms for a KITTI frame's
    60,152 voxels x 19 classes); None where that does not apply."""
    if x.device.type != "cpu" or x.dtype != torch.float32 or x.dim() != 2:
        return None
    n, c = x.shape
    if not 1 <= c <= 256:
        return None
    out = torch.empty(n, dtype=torch.uint8)
    backend.call("argmax_rows_u8", "cpu", x.contiguous(), n, c, out)
    return out


HEAD_LANES = 32  # the widest head ls_linear_argmax_u8_cpu takes (classes)


@dataclass(frozen=True)
class HeadColumns:
    """An nn.Linear head as ls_linear_argmax_u8_cpu reads it: weight [F, HEAD_LANES], bias
    [HEAD_LANES] (zero beyond its classes), and how many classes it has."""

    weight: torch.Tensor
    bias: torch.Tensor
    classes: int

    @property
    def features(self) -> int:
        return self.weight.shape[0]


def head_columns(weight: torch.Tensor, bias: torch.Tensor | None) -> HeadColumns | None:
    """The head (weight [C, F], bias [C]) in the kernels' layout, or None where they do not
    take it: more than HEAD_LANES classes, not fp32 on the CPU, or a gradient wanted."""
    if (
        weight.device.type != "cpu"
        or weight.dtype != torch.float32
        or weight.dim() != 2
        or not 1 <= weight.shape[0] <= HEAD_LANES
        or torch.is_grad_enabled()
    ):
        return None
    w_t = derived(weight, "head_columns", _head_columns)
    b = torch.zeros(HEAD_LANES) if bias is None else derived(bias, "head_columns", _head_columns)
    return HeadColumns(w_t, b, weight.shape[0])


def linear_argmax_u8(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor | None:
    """uint8 [N]: argmax over classes of x @ weight.T + bias (an nn.Linear head, weight [C, F])
    for CPU float32 rows x [N, F] and at most HEAD_LANES classes, in one pass that never writes
    the logits (ls_linear_argmax_u8_cpu); None where that does not apply. Its sums run in another
    order than torch's matmul, so a voxel whose two best logits tie to the last bits may get the
    other class."""
    head = head_columns(weight, bias)
    if (
        head is None
        or x.device.type != "cpu"
        or x.dtype != torch.float32
        or x.dim() != 2
        or head.features != x.shape[1]
    ):
        return None
    out = torch.empty(x.shape[0], dtype=torch.uint8)
    n, cin = x.shape
    backend.call(
        "linear_argmax_u8", "cpu", x.contiguous(), n, cin, head.weight, head.bias, head.classes, out
    )
    return out


def _head_columns(param: torch.Tensor) -> torch.Tensor:
    """A head's weight [C, F] as columns [F, HEAD_LANES], or its bias [C] as [HEAD_LANES]; zero
    beyond its C classes."""
    if param.dim() == 1:
        out = torch.zeros(HEAD_LANES)
        out[: param.shape[0]] = param.detach()
        return out
    classes, features = param.shape
    out = torch.zeros(features, HEAD_LANES)
    out[:, :classes] = param.detach().t()
    return out
