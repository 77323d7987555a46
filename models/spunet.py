"""SpUNet-v1m1 (Pointcept's sparse UNet, `SpUNet-v1m1`) on our sparse layers.

Checked against Pointcept/Pointcept pointcept/models/sparse_unet/spconv_unet_v1m1_base.py
(class SpUNetBase, BasicBlock), with S = len(layers) // 2 stages and n = len(channels) = 2S:

    conv_input  SubM k5 (in -> base) -> BN -> ReLU                                  (stride 1)
    down[s]     SparseConv3d k2 s2 (enc_in(s) -> channels[s]) -> BN -> ReLU   (stride 2^(s+1))
    enc[s]      layers[s] BasicBlocks channels[s] -> channels[s]
    up[s]       SparseInverseConv3d k2 (channels[n-s-2] -> channels[n-s-1]) -> BN -> ReLU,
                the inverse of down[s]                                          (stride 2^s)
    dec[s]      cat(up output, skip) with the up output FIRST, skip = the input of down[s];
                layers[n-s-1] BasicBlocks, block0 (channels[n-s-1] + enc_in(s) ->
                channels[n-s-1]) with a 1x1 projection, the others channels[n-s-1] -> itself
    final       SubM k1 with bias (channels[n-1] -> num_classes)
where enc_in(0) = base_channels and enc_in(s) = channels[s-1]. The encoder runs s = 0..S-1;
the decoder runs s = S-1..0 (the deepest up first), so up[S-1] takes enc[S-1]'s channels[S-1]
= channels[n-S-1] and up[s] takes dec[s+1]'s channels[n-s-2].

BasicBlock: conv1 SubM k3, bn1, ReLU, conv2 SubM k3, bn2, + proj(x), ReLU; proj is the
identity when the channel count is kept, else (1x1 SubM, BN) as proj.0 / proj.1. Convs have
no bias except `final`. BN is BatchNorm1d(eps=1e-3, momentum=0.01). Pointcept writes the stem
with padding=1, which spconv ignores for submanifold convolutions (its map is centred), so it is
the centred k5 our SubMConv3d builds. The module tree and names here are Pointcept's, so our
state-dict keys are its keys; only conv weights differ in layout (models/pointcept.py).

Pointcept feeds `grid_coord` = floor(xyz / grid) minus the cloud's per-axis minimum (its
GridSample). The stride-2 levels group voxels by floor(c / 2^k), so to reproduce its output
exactly feed the same coordinates (or any shift of them by a multiple of 2^S).
Not covered: Pointcept's cls_mode and num_classes = 0 (no `final`).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from torch import nn

from .labels import NUM_CLASSES
from .layers import BatchNorm, ReLU, SparseConv3d, SparseInverseConv3d, SubMConv3d, cat
from .minkunet import ConvBNReLU
from .sparse_tensor import SparseTensor


@dataclass(frozen=True)
class SpUNetConfig:
    in_channels: int = 4
    num_classes: int = NUM_CLASSES
    base_channels: int = 32
    channels: tuple[int, ...] = (32, 64, 128, 256, 256, 128, 96, 96)
    layers: tuple[int, ...] = (2, 3, 4, 6, 2, 2, 2, 2)
    bn_eps: float = 1e-3
    bn_momentum: float = 0.01

    def __post_init__(self):
        if len(self.layers) % 2 or len(self.layers) != len(self.channels) or not self.layers:
            raise ValueError(
                f"channels {self.channels} and layers {self.layers} must have the "
                "same, even, non-zero length"
            )
        if min(self.channels + (self.base_channels, self.in_channels, self.num_classes)) < 1:
            raise ValueError(f"every channel count must be >= 1: {self}")
        if min(self.layers) < 1:
            raise ValueError(f"every stage needs at least one block, got layers {self.layers}")

    @property
    def num_stages(self) -> int:
        return len(self.layers) // 2

    def enc_in(self, s: int) -> int:
        """Channels entering down[s], which are also dec[s]'s skip channels."""
        return self.base_channels if s == 0 else self.channels[s - 1]

    def dec_channels(self, s: int) -> int:
        """Channels out of up[s] and dec[s]."""
        return self.channels[len(self.channels) - s - 1]

    def dec_layers(self, s: int) -> int:
        return self.layers[len(self.layers) - s - 1]


def _bn(channels: int, config: SpUNetConfig) -> BatchNorm:
    return BatchNorm(channels, eps=config.bn_eps, momentum=config.bn_momentum)


class BasicBlock(nn.Module):
    """conv1, bn1, ReLU, conv2, bn2, + proj(x) (identity, or 1x1 SubM + BN), ReLU."""

    def __init__(self, cin: int, cout: int, config: SpUNetConfig):
        super().__init__()
        self.proj = (
            nn.Identity()
            if cin == cout
            else nn.Sequential(SubMConv3d(cin, cout, 1), _bn(cout, config))
        )
        self.conv1 = SubMConv3d(cin, cout, 3)
        self.bn1 = _bn(cout, config)
        self.relu = ReLU()
        self.conv2 = SubMConv3d(cout, cout, 3)
        self.bn2 = _bn(cout, config)

    def forward(self, x: SparseTensor) -> SparseTensor:
        out = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
        return self.relu(out.replace_feats(out.feats + self.proj(x).feats))


def _blocks(cin: int, cout: int, count: int, config: SpUNetConfig) -> nn.Sequential:
    return nn.Sequential(
        OrderedDict(
            (f"block{i}", BasicBlock(cin if i == 0 else cout, cout, config)) for i in range(count)
        )
    )


class SpUNet(nn.Module):
    def __init__(self, config: SpUNetConfig | None = None):
        super().__init__()
        self.config = cfg = config or SpUNetConfig()
        n, stages = len(cfg.channels), range(cfg.num_stages)
        self.conv_input = ConvBNReLU(
            SubMConv3d(cfg.in_channels, cfg.base_channels, 5), cfg.base_channels, cfg
        )
        self.down = nn.ModuleList(
            ConvBNReLU(SparseConv3d(cfg.enc_in(s), cfg.channels[s], 2, 2), cfg.channels[s], cfg)
            for s in stages
        )
        self.enc = nn.ModuleList(
            _blocks(cfg.channels[s], cfg.channels[s], cfg.layers[s], cfg) for s in stages
        )
        self.up = nn.ModuleList(
            ConvBNReLU(
                SparseInverseConv3d(cfg.channels[n - s - 2], cfg.dec_channels(s), 2),
                cfg.dec_channels(s),
                cfg,
            )
            for s in stages
        )
        self.dec = nn.ModuleList(
            _blocks(
                cfg.dec_channels(s) + cfg.enc_in(s), cfg.dec_channels(s), cfg.dec_layers(s), cfg
            )
            for s in stages
        )
        self.final = SubMConv3d(cfg.channels[-1], cfg.num_classes, 1, bias=True)

    def forward(self, x: SparseTensor) -> SparseTensor:
        """x: [N, in_channels] on stride 1 -> per-voxel logits [N, num_classes], same rows."""
        x = self.conv_input(x)  # [N, base], stride 1
        skips = [x]
        for down, enc in zip(self.down, self.enc):
            x = enc(down(x))  # [N_s, channels[s]], stride 2^(s+1)
            skips.append(x)
        x = skips.pop()
        for s in reversed(range(self.config.num_stages)):
            x = self.up[s](x)  # [N, dec_channels(s)], stride 2^s
            x = self.dec[s](cat(x, skips.pop()))  # cat: [N, dec_channels(s) + enc_in(s)]
        return self.final(x)  # [N, num_classes], stride 1
