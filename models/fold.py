"""Inference-time folding of BatchNorm, and a ReLU right after it, into the preceding sparse conv.

In eval mode a BatchNorm is a per-channel affine map, y = (x - mean) * s + beta with
s = gamma / sqrt(var + eps). After a conv x -> sum_k x_k @ W[k] (+ b) it is the same conv with

    W'[k][:, o] = W[k][:, o] * s[o]        b'[o] = (b[o] - mean[o]) * s[o] + beta[o]

and a ReLU that follows becomes the conv's epilogue, computed inside the fused CPU kernel while
each block of output rows is still in cache (csrc/fused_cpu.cpp). Residual blocks (MinkUNet's
ResidualBlock, SpUNet's BasicBlock) become FoldedResidualBlock: relu(conv2(conv1(x)) + shortcut(x))
with the shortcut added in conv2's epilogue, before the block's ReLU. MinkUNet's decoder stages
become FoldedDecoderStage, whose upsampling (its BatchNorm and ReLU folded) makes the
concatenation with the skip rows itself.

`fold_batchnorm` returns a folded copy for inference; the original model, its state_dict and
checkpoints, and the weight transfers to the spconv twin are untouched. Besides residual blocks,
pairs are folded where a conv and a BatchNorm sit next to each other in an nn.Sequential (with a
ReLU right after them folded too); anything else is left as it is.
"""

from __future__ import annotations

import contextlib
import copy
from typing import cast

import torch
from torch import nn

from kernels.rows import HeadColumns

from .layers import BatchNorm, ReLU, SparseConv3d, SparseInverseConv3d, SubMConv3d, _SparseConv
from .minkunet import ConvBNReLU, DecoderStage, EncoderStage, MinkUNet, ResidualBlock
from .sparse_tensor import SparseTensor
from .spunet import BasicBlock


class FoldedResidualBlock(nn.Module):
    """relu(conv2(conv1(x)) + shortcut(x)) with the BatchNorms folded: conv1 ends in its ReLU,
    conv2's epilogue adds the shortcut and applies the block's ReLU. conv1's output feeds conv2
    alone (in int8 inference it is kept only quantized, never written out in fp32).
    feeds_head: this block's output is what the network's head reads (fold_batchnorm marks
    MinkUNet's last block); inside classes_in_last_conv, `head` is that head, which conv2 may
    apply in its own kernel."""

    def __init__(self, conv1: SubMConv3d, conv2: SubMConv3d, shortcut: nn.Module):
        super().__init__()
        self.conv1, self.conv2, self.shortcut = conv1, conv2, shortcut
        self.conv1.relu = self.conv2.relu = True
        self.feeds_head = False
        self.head: HeadColumns | None = None

    def forward(self, x: SparseTensor) -> SparseTensor:
        h = self.conv1(x, only_next_reads=True)
        head = None if _hooked(self.conv2) else self.head  # a timed layer runs as itself
        conv = _bare_shortcut(self.shortcut)
        if conv is None:
            return self.conv2(h, residual=self.shortcut(x).feats, head=head)
        return self.conv2(h, shortcut=(conv, x), head=head)


def head_blocks(network: nn.Module) -> tuple[FoldedResidualBlock, ...]:
    """The blocks whose output the network's head reads (feeds_head): what classes_in_last_conv
    hands the head to. Found once per network (walking its modules costs about 0.2 ms)."""
    return tuple(
        m for m in network.modules() if isinstance(m, FoldedResidualBlock) and m.feeds_head
    )


@contextlib.contextmanager
def classes_in_last_conv(blocks: tuple[FoldedResidualBlock, ...], head: HeadColumns | None):
    """Within: the blocks whose output the head reads (head_blocks) hand `head` to their last
    conv, so that in int8 inference the features come back as a ClassifiedOutput (kernels/
    concat.py) holding each row's class, the rows themselves never written (the pipeline's
    network stage). Nothing changes where there is no such block, or head is None."""
    for block in blocks:
        block.head = head
    try:
        yield
    finally:
        for block in blocks:
            block.head = None


def _hooked(module: nn.Module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks)


def _folded_conv(module: nn.Module, kind: type) -> nn.Module | None:
    """The conv of type `kind` that module amounts to once folded: the conv itself, or an
    nn.Sequential of it whose BatchNorm and ReLU folding left Identity; else None."""
    modules = list(module) if isinstance(module, nn.Sequential) else [module]
    if not modules or not isinstance(modules[0], kind):
        return None
    return modules[0] if all(isinstance(m, nn.Identity) for m in modules[1:]) else None


def _bare_shortcut(shortcut: nn.Module) -> SubMConv3d | None:
    """The 1x1 conv a folded shortcut is, where conv2 may run it itself (no ReLU, and no hooks:
    a timed layer runs as itself); else None."""
    conv = cast(SubMConv3d | None, _folded_conv(shortcut, SubMConv3d))
    if conv is None or conv.kernel_size != 1 or conv.relu:
        return None
    return None if _hooked(conv) else conv


class FoldedDecoderStage(nn.Module):
    """A MinkUNet DecoderStage with its upsampling's BatchNorm and ReLU folded into the conv:
    blocks(cat(up(x), skip)), the concatenation made by the upsampling itself (in int8 it
    quantizes its rows beside the skip rows, and its fp32 rows are never written out)."""

    def __init__(self, up: nn.Sequential, blocks: nn.Module):
        super().__init__()
        self.up, self.blocks = up, blocks

    def forward(self, x: SparseTensor, skip: SparseTensor) -> SparseTensor:
        return self.blocks(self.up[0](x, concat=skip))


def fold_batchnorm(model: nn.Module) -> nn.Module:
    """A copy of `model` in eval mode with its BatchNorms (and the ReLUs they feed) folded into
    the convs before them, and its residual blocks folded into FoldedResidualBlock."""
    folded = copy.deepcopy(model).eval()
    for parent in list(folded.modules()):
        for name, child in list(parent.named_children()):
            block = _fold_residual(child)
            if block is not None:
                setattr(parent, name, block)
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
    for parent in list(folded.modules()):
        for name, child in list(parent.named_children()):
            if not isinstance(child, DecoderStage):
                continue
            up = _folded_conv(child.up, SparseInverseConv3d)
            if up is not None and cast(SparseInverseConv3d, up).relu:
                setattr(parent, name, FoldedDecoderStage(child.up, child.blocks))
    _mark_head_block(folded)
    return folded


def _mark_head_block(folded: nn.Module) -> None:
    """feeds_head on the folded block whose output a MinkUNet's head reads: the last block of
    its last decoder stage (MinkUNet.features returns that stage's output)."""
    if not isinstance(folded, MinkUNet) or not len(folded.decoder):
        return
    blocks = getattr(folded.decoder[-1], "blocks", None)
    last = blocks[-1] if isinstance(blocks, nn.Sequential) and len(blocks) else None
    if isinstance(last, FoldedResidualBlock):
        last.feeds_head = True


def _fold_residual(block: nn.Module) -> FoldedResidualBlock | None:
    shortcut: nn.Module
    if isinstance(block, ResidualBlock):  # net: conv1, bn1, ReLU, conv2, bn2
        conv1, bn1 = cast(SubMConv3d, block.net[0]), cast(BatchNorm, block.net[1])
        conv2, bn2 = cast(SubMConv3d, block.net[3]), cast(BatchNorm, block.net[4])
        shortcut = block.shortcut
    elif isinstance(block, BasicBlock):
        conv1, bn1, conv2, bn2, shortcut = (
            block.conv1,
            block.bn1,
            block.conv2,
            block.bn2,
            block.proj,
        )
    else:
        return None
    _fold_into(conv1, bn1)
    _fold_into(conv2, bn2)
    return FoldedResidualBlock(conv1, conv2, shortcut)  # a Sequential shortcut folds later


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


# What a folded MinkUNet's features may be made of for its kernel calls to wait and run together
# (kernels/deferred.py): layers that hand their rows only to the engine's convs and stand-ins.
# An unfolded BatchNorm, ReLU or residual add would read rows whose kernels have not run yet.
DEFERRABLE_LAYERS = (
    FoldedResidualBlock,
    FoldedDecoderStage,
    EncoderStage,
    ConvBNReLU,  # an nn.Sequential; folded, a conv and Identities
    SubMConv3d,
    SparseConv3d,
    SparseInverseConv3d,
    nn.Sequential,
    nn.ModuleList,
    nn.Identity,
)


def runs_deferred(network: nn.Module) -> bool:
    """Whether network.features(x) may run inside kernels/deferred.py's calls_deferred(): a
    folded MinkUNet whose modules, but for its head, are all DEFERRABLE_LAYERS."""
    if not isinstance(network, MinkUNet):
        return False
    return all(
        type(module) in DEFERRABLE_LAYERS
        for name, module in network.named_modules()
        if name and name != "head"
    )
