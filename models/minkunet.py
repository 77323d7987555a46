"""MinkUNet (Choy et al. 2019; the SPVNAS / mmdetection3d topology) on our sparse layers.

    stem      SubM k3 -> BN -> ReLU -> SubM k3 -> BN -> ReLU                        (stride 1)
    encoder   4 stages: SparseConv3d k2 s2 -> BN -> ReLU, then residual blocks     (stride 2..16)
    decoder   4 stages: SparseInverseConv3d k2 -> BN -> ReLU, concatenate the encoder skip
              of the same stride, then residual blocks                             (stride 8..1)
    head      Linear(channels[8], num_classes) on every voxel
A residual block is SubM k3, BN, ReLU, SubM k3, BN, plus the shortcut (identity, or a 1x1 SubM
and BN when the channel count changes), then ReLU. MinkUNet34 is encoder_blocks (2, 3, 4, 6).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol, cast

from torch import nn

from .labels import NUM_CLASSES
from .layers import BatchNorm, ReLU, SparseConv3d, SparseInverseConv3d, SubMConv3d, cat
from .sparse_tensor import MapRequest, SparseTensor

BASE_CHANNELS = (32, 32, 64, 128, 256, 256, 128, 96, 96)


@dataclass(frozen=True)
class MinkUNetConfig:
    in_channels: int = 4
    num_classes: int = NUM_CLASSES
    cr: float = 1.0  # channel ratio: scales BASE_CHANNELS
    encoder_blocks: tuple[int, ...] = (2, 2, 2, 2)
    decoder_blocks: tuple[int, ...] = (2, 2, 2, 2)
    bn_eps: float = 1e-5
    bn_momentum: float = 0.1

    @property
    def channels(self) -> tuple[int, ...]:
        return tuple(int(self.cr * c) for c in BASE_CHANNELS)

    def __post_init__(self):
        if len(self.encoder_blocks) != 4 or len(self.decoder_blocks) != 4:
            raise ValueError("MinkUNet has 4 encoder and 4 decoder stages")
        if min(self.channels) < 1:
            raise ValueError(f"cr={self.cr} leaves a stage without channels")


class BatchNormConfig(Protocol):
    """What ConvBNReLU reads from a model config (MinkUNetConfig, SpUNetConfig)."""

    @property
    def bn_eps(self) -> float: ...

    @property
    def bn_momentum(self) -> float: ...


class ConvBNReLU(nn.Sequential):
    """conv -> BN -> ReLU, for any of our sparse convolutions (BN eps / momentum from the config:
    a MinkUNetConfig, or SpUNetConfig in models/spunet.py)."""

    def __init__(self, conv: nn.Module, channels: int, config: BatchNormConfig):
        super().__init__(
            conv, BatchNorm(channels, eps=config.bn_eps, momentum=config.bn_momentum), ReLU()
        )


class ResidualBlock(nn.Module):
    def __init__(self, cin: int, cout: int, config: MinkUNetConfig):
        super().__init__()
        bn = lambda c: BatchNorm(c, eps=config.bn_eps, momentum=config.bn_momentum)
        self.net = nn.Sequential(
            SubMConv3d(cin, cout, 3), bn(cout), ReLU(), SubMConv3d(cout, cout, 3), bn(cout)
        )
        self.shortcut = (
            nn.Identity() if cin == cout else nn.Sequential(SubMConv3d(cin, cout, 1), bn(cout))
        )
        self.relu = ReLU()

    def forward(self, x: SparseTensor) -> SparseTensor:
        out = self.net(x)
        return self.relu(out.replace_feats(out.feats + self.shortcut(x).feats))


def residual_stack(cin: int, cout: int, blocks: int, config: MinkUNetConfig) -> nn.Sequential:
    return nn.Sequential(
        *(ResidualBlock(cin if i == 0 else cout, cout, config) for i in range(blocks))
    )


class EncoderStage(nn.Module):
    def __init__(self, cin: int, cout: int, blocks: int, config: MinkUNetConfig):
        super().__init__()
        self.down = ConvBNReLU(SparseConv3d(cin, cin, 2, 2), cin, config)
        self.blocks = residual_stack(cin, cout, blocks, config)

    def forward(self, x: SparseTensor) -> SparseTensor:
        return self.blocks(self.down(x))  # stride doubles


class DecoderStage(nn.Module):
    def __init__(self, cin: int, skip: int, cout: int, blocks: int, config: MinkUNetConfig):
        super().__init__()
        self.up = ConvBNReLU(SparseInverseConv3d(cin, cout, 2), cout, config)
        self.blocks = residual_stack(cout + skip, cout, blocks, config)

    def forward(self, x: SparseTensor, skip: SparseTensor) -> SparseTensor:
        return self.blocks(cat(self.up(x), skip))  # stride halves; [N, cout + skip]


class MinkUNet(nn.Module):
    def __init__(
        self,
        in_channels: int = 4,
        num_classes: int = NUM_CLASSES,
        cr: float = 1.0,
        blocks: tuple[int, ...] = (2, 2, 2, 2),
        config: MinkUNetConfig | None = None,
    ):
        super().__init__()
        self.config = config or MinkUNetConfig(in_channels, num_classes, cr, tuple(blocks))
        cfg, cs = self.config, self.config.channels
        self.stem = nn.Sequential(
            ConvBNReLU(SubMConv3d(cfg.in_channels, cs[0], 3), cs[0], cfg),
            ConvBNReLU(SubMConv3d(cs[0], cs[0], 3), cs[0], cfg),
        )
        self.encoder = nn.ModuleList(
            EncoderStage(cs[i], cs[i + 1], cfg.encoder_blocks[i], cfg) for i in range(4)
        )
        self.decoder = nn.ModuleList(
            DecoderStage(cs[4 + i], cs[3 - i], cs[5 + i], cfg.decoder_blocks[i], cfg)
            for i in range(4)
        )
        self.head = nn.Linear(cs[8], cfg.num_classes)

    def forward(self, x: SparseTensor) -> SparseTensor:
        """x: [N, in_channels] on stride 1 -> per-voxel logits [N, num_classes], same rows."""
        y = self.features(x)
        return y.replace_feats(self.head(y.feats))

    def features(self, x: SparseTensor) -> SparseTensor:
        """What the head reads: [N, channels[8]] on stride 1, same rows as x."""
        skips = [self.stem(x)]  # stride 1
        for stage in self.encoder:
            skips.append(stage(skips[-1]))  # strides 2, 4, 8, 16
        y = skips.pop()
        for stage in self.decoder:
            y = stage(y, skips.pop())  # strides 8, 4, 2, 1
        return y

    def map_requests(self) -> tuple[MapRequest, ...]:
        """Every kernel map forward() uses, each once, in the order it first needs them (the
        pipeline's maps stage builds them all before the network runs)."""
        requests = _submanifold_requests(self.stem, 1)
        for i, enc in enumerate(cast(Iterable[EncoderStage], self.encoder)):
            down = cast(SparseConv3d, enc.down[0])
            requests.append(MapRequest("downsample", 2**i, down.kernel_size, down.stride))
            requests += _submanifold_requests(enc.blocks, 2 ** (i + 1))
        for i, dec in enumerate(cast(Iterable[DecoderStage], self.decoder)):
            up = cast(SparseInverseConv3d, dec.up[0])
            requests.append(MapRequest("upsample", 2 ** (4 - i), up.kernel_size))
            requests += _submanifold_requests(dec.blocks, 2 ** (3 - i))
        return tuple(dict.fromkeys(requests))


def _submanifold_requests(module: nn.Module, stride: int) -> list[MapRequest]:
    return [
        MapRequest("submanifold", stride, m.kernel_size, m.dilation)
        for m in module.modules()
        if isinstance(m, SubMConv3d)
    ]


def minkunet34(in_channels: int = 4, num_classes: int = NUM_CLASSES, cr: float = 1.0) -> MinkUNet:
    return MinkUNet(in_channels, num_classes, cr, blocks=(2, 3, 4, 6))
