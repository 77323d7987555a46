"""Sparse layers. Every conv holds `weight` [K^3, Cin, Cout].

Kernel index k = a*K*K + b*K + c for kernel position (a, b, c) in [0, K)^3 (c fastest). The input
feeding output q through that position sits at q*stride + (a, b, c) - padding on (x, y, z);
padding = K // 2 for SubMConv3d and 0 for SparseConv3d, and SparseInverseConv3d uses the same
positions in reverse. spconv's weight [Cout, K, K, K, Cin] converts with
`weight_from_spconv` (models/spconv_compat.py).
"""

from __future__ import annotations

import math
from typing import cast

import torch
from torch import nn

from kernels.concat import concat_rows
from kernels.engine import sparse_conv
from kernels.rows import HeadColumns

from .sparse_tensor import SparseTensor


class _SparseConv(nn.Module):
    def __init__(self, cin: int, cout: int, kernel_size: int, bias: bool):
        super().__init__()
        self.in_channels, self.out_channels, self.kernel_size = cin, cout, kernel_size
        self.weight = nn.Parameter(torch.empty(kernel_size**3, cin, cout))
        self.bias = nn.Parameter(torch.zeros(cout)) if bias else None
        self.relu = False  # set by models.fold.fold_batchnorm when a ReLU follows
        bound = 1.0 / math.sqrt(cin * kernel_size**3)
        nn.init.uniform_(self.weight, -bound, bound)

    def _conv(
        self,
        x: SparseTensor,
        kmap,
        residual: torch.Tensor | None = None,
        only_next_reads: bool = False,
        then_concat: torch.Tensor | None = None,
        shortcut: tuple | None = None,
        head: HeadColumns | None = None,
    ) -> torch.Tensor:
        return sparse_conv(
            x.feats,
            self.weight,
            kmap,
            x.engine,
            self.bias,
            self.relu,
            residual,
            only_next_reads,
            then_concat,
            shortcut,
            head,
        )

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"bias={self.bias is not None}" + (", relu=True" if self.relu else "")
        )


class SubMConv3d(_SparseConv):
    """Submanifold convolution: outputs on the input's coordinates, rows in input order."""

    def __init__(
        self, cin: int, cout: int, kernel_size: int = 3, bias: bool = False, dilation: int = 1
    ):
        if kernel_size % 2 != 1:
            raise ValueError(f"SubMConv3d needs an odd kernel_size, got {kernel_size}")
        super().__init__(cin, cout, kernel_size, bias)
        self.dilation = dilation

    def forward(
        self,
        x: SparseTensor,
        residual: torch.Tensor | None = None,
        only_next_reads: bool = False,
        shortcut: tuple[SubMConv3d, SparseTensor] | None = None,
        head: HeadColumns | None = None,
    ) -> SparseTensor:
        """residual [N, Cout] (optional) is added before the ReLU of a folded block
        (models/fold.py), or shortcut(conv, its input)'s output is (a 1x1 conv without ReLU, on
        x's rows: int8 inference adds it in this conv's kernel); only_next_reads: the output
        feeds the next conv alone (the folded block's first conv), which lets int8 inference
        keep it only quantized (kernels/engine.py, sparse_conv); head: the caller wants that
        head's class of each output row (the network's last conv), which int8 inference may
        compute in this conv's kernel (the feats are then a ClassifiedOutput)."""
        kmap = x.manager.submanifold_map(x.stride, self.kernel_size, self.dilation)
        shortcut_conv = None  # (its input rows, weight, bias, map), as sparse_conv takes it
        if shortcut is not None:
            conv, src = shortcut
            sc_kmap = src.manager.submanifold_map(src.stride, conv.kernel_size, conv.dilation)
            shortcut_conv = (src.feats, conv.weight, conv.bias, sc_kmap)
        return x.replace_feats(
            self._conv(x, kmap, residual, only_next_reads, None, shortcut_conv, head)
        )


class SparseConv3d(_SparseConv):
    """Strided convolution; outputs are the unique floor(coords / stride)."""

    def __init__(
        self, cin: int, cout: int, kernel_size: int = 2, stride: int = 2, bias: bool = False
    ):
        super().__init__(cin, cout, kernel_size, bias)
        self.stride = stride

    def forward(self, x: SparseTensor) -> SparseTensor:
        made = x.manager.downsample(x.stride, self.kernel_size, self.stride)
        coarse = x.stride * self.stride
        return SparseTensor(self._conv(x, made.kmap), x.manager.coords(coarse), coarse, x.manager)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", stride={self.stride}"


class SparseInverseConv3d(_SparseConv):
    """The exact inverse of the SparseConv3d that produced the input's level: outputs are the
    finer level's coordinates, in its row order."""

    def __init__(self, cin: int, cout: int, kernel_size: int = 2, bias: bool = False):
        super().__init__(cin, cout, kernel_size, bias)

    def forward(self, x: SparseTensor, concat: SparseTensor | None = None) -> SparseTensor:
        """concat (on the finer level): the output is cat(this conv's output, concat), which a
        decoder's next convs alone read (in int8 the two are quantized side by side in the
        kernel, and this conv's fp32 rows are never written out: kernels/engine.py)."""
        made = x.manager.upsample(x.stride, self.kernel_size)
        fine = made.fine_stride
        if concat is not None and (concat.manager is not x.manager or concat.stride != fine):
            raise ValueError("an upsampling concatenates a tensor of the level it makes")
        feats = self._conv(
            x,
            made.kmap.transposed,
            only_next_reads=concat is not None,
            then_concat=None if concat is None else concat.feats,
        )
        return SparseTensor(feats, x.manager.coords(fine), fine, x.manager)


class BatchNorm(nn.BatchNorm1d):
    """BatchNorm over the feature rows of a SparseTensor."""

    def forward(self, x: SparseTensor) -> SparseTensor:  # type: ignore[override]
        return x.replace_feats(super().forward(x.feats))


class ReLU(nn.ReLU):
    def forward(self, x: SparseTensor) -> SparseTensor:  # type: ignore[override]
        return x.replace_feats(super().forward(x.feats))


def cat(a: SparseTensor, b: SparseTensor) -> SparseTensor:
    """Channel concatenation of two tensors on the same coordinates (same rows)."""
    if a.manager is not b.manager or a.stride != b.stride:
        if a.coords.shape != b.coords.shape or not torch.equal(a.coords, b.coords):
            raise ValueError("cat needs two tensors on the same coordinates, row for row")
    # on the CPU in int8 inference, a RowConcat: the convs that read it quantize the two parts
    # side by side and the concatenation is never made (kernels/concat.py)
    # (it stands in for the tensor: torch functions and attributes make the tensor on first use)
    feats = cast(torch.Tensor, concat_rows(a.feats, b.feats, a.engine.precision))
    return a.replace_feats(feats)
