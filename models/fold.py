"""Inference-time folding of BatchNorm, and a ReLU right after it, into the preceding sparse conv.

In eval mode a BatchNorm is a per-channel affine map, y = (x - mean) * s + beta with
s = gamma / sqrt(var + eps). After a conv x -> sum_k x_k @ W[k] (+ b) it is the same conv with

    W'[k][:, o] = W[k][:, o] * s[o]        b'[o] = (b[o] - mean[o]) * s[o] + beta[o]

and a ReLU that follows becomes the conv's epilogue (computed inside the fused CPU kernel while
each block of output rows is still in cache, csrc/fused_cpu.cpp). `fold_batchnorm` returns a
folded copy for inference; the original model, its state_dict and checkpoints, and the weight
transfers to the spconv twin are untouched. Pairs are folded where a conv and a BatchNorm sit next
to each other in an nn.Sequential (with a ReLU right after them folded too), and where a module
names its pairs of attributes in `BN_FOLDS` (SpUNet's BasicBlock, whose ReLU module is shared and
stays); anything else is left as it is.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from .layers import BatchNorm, ReLU, _SparseConv


def fold_batchnorm(model: nn.Module) -> nn.Module:
    """A copy of `model` in eval mode with every conv -> BatchNorm (-> ReLU) in a Sequential
    folded into the conv (BatchNorm and ReLU replaced by nn.Identity)."""
    folded = copy.deepcopy(model).eval()
    for seq in [m for m in folded.modules() if isinstance(m, nn.Sequential)]:
        names = list(seq._modules)
        for i in range(len(names) - 1):
            conv, norm = seq._modules[names[i]], seq._modules[names[i + 1]]
            if not (isinstance(conv, _SparseConv) and isinstance(norm, BatchNorm)) or conv.relu:
                continue
            _fold_into(conv, norm)
            seq._modules[names[i + 1]] = nn.Identity()
            if i + 2 < len(names) and type(seq._modules[names[i + 2]]) is ReLU:
                conv.relu = True
                seq._modules[names[i + 2]] = nn.Identity()
    for block in folded.modules():
        for conv_name, norm_name in getattr(block, "BN_FOLDS", ()):
            _fold_into(getattr(block, conv_name), getattr(block, norm_name))
            setattr(block, norm_name, nn.Identity())
    return folded


@torch.no_grad()
def _fold_into(conv: _SparseConv, norm: BatchNorm) -> None:
    if norm.running_mean is None or norm.running_var is None:
        raise ValueError("cannot fold a BatchNorm without running statistics")
    mean, var = norm.running_mean.float(), norm.running_var.float()
    scale = torch.rsqrt(var + norm.eps)
    shift = -mean * scale
    if norm.affine:
        scale, shift = scale * norm.weight.float(), shift * norm.weight.float() + norm.bias.float()
    bias = conv.bias.float() * scale if conv.bias is not None else torch.zeros_like(scale)
    dtype = conv.weight.dtype
    conv.weight.copy_((conv.weight.float() * scale).to(dtype))  # [K, Cin, Cout] * [Cout]
    conv.bias = nn.Parameter((bias + shift).to(dtype), requires_grad=False)
