"""Pointcept's SpUNet-v1m1 rebuilt on spconv 2.x: the reference twin of models/spunet.py.

Written from the facts checked in Pointcept/Pointcept
pointcept/models/sparse_unet/spconv_unet_v1m1_base.py (see models/spunet.py): the same module
names (conv_input, down, enc, up, dec, final; enc/dec blocks "block{i}"; BasicBlock conv1, bn1,
relu, conv2, bn2, proj), the same spconv modules and arguments (stem SubM k5 with padding 1,
final SubM k1 with padding 1 and bias) and the same indice keys:
    "stem"         the k5 submanifold map of the input level;
    "spconv{s+1}"  down[s]'s k2 s2 map; up[s] uses the same key, so it is down[s]'s inverse;
    "subm{s+1}"    enc[s]'s k3 submanifold map (stride 2^(s+1)), shared with dec[s+1];
    "subm0"        dec[0]'s k3 map at stride 1 (another key than the k5 "stem").
So `state_dict()` holds genuine Pointcept keys, with spconv's [Cout, K, K, K, Cin] weights.

Two departures, neither touching the weights: forward takes and returns a SparseConvTensor
(Pointcept's forward takes its data dict and returns `.features`), and the enc / dec stages are
nn.Sequential of nn.Module blocks instead of SparseSequential of SparseModule blocks (same keys;
it keeps `spconv` a lazy import). Run it with models.spconv_twin.run_spconv, which shifts the
coordinates by a multiple of 16 (so floor(c / 2^k) agrees with ours over 4 levels), rounds the
spatial shape and runs spconv single-threaded on the CPU (spconv issue #679).
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

from .spconv_compat import native_algo
from .spunet import SpUNetConfig


def _spconv():
    import spconv.pytorch as spconv  # lazy: spconv is an optional dependency

    return spconv


def _bn(channels: int, config: SpUNetConfig) -> nn.BatchNorm1d:
    return nn.BatchNorm1d(channels, eps=config.bn_eps, momentum=config.bn_momentum)


def _subm3(cin: int, cout: int, indice_key: str) -> nn.Module:
    """spconv's SubMConv3d k3 (padding 1, no bias) on the given indice key."""
    return _spconv().SubMConv3d(
        cin, cout, 3, stride=1, padding=1, bias=False, algo=native_algo(), indice_key=indice_key
    )


class SpconvBasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, indice_key: str, config: SpUNetConfig):
        super().__init__()
        sp = _spconv()
        self.proj = (
            sp.SparseSequential(nn.Identity())
            if cin == cout
            else sp.SparseSequential(
                sp.SubMConv3d(cin, cout, kernel_size=1, bias=False, algo=native_algo()),
                _bn(cout, config),
            )
        )
        self.conv1 = _subm3(cin, cout, indice_key)
        self.bn1 = _bn(cout, config)
        self.relu = nn.ReLU()
        self.conv2 = _subm3(cout, cout, indice_key)
        self.bn2 = _bn(cout, config)

    def forward(self, x):
        out = self.conv1(x)
        out = out.replace_feature(self.relu(self.bn1(out.features)))
        out = self.conv2(out)
        out = out.replace_feature(self.bn2(out.features) + self.proj(x).features)
        return out.replace_feature(self.relu(out.features))


def _blocks(cin: int, cout: int, count: int, indice_key: str, config: SpUNetConfig):
    return nn.Sequential(
        OrderedDict(
            (f"block{i}", SpconvBasicBlock(cin if i == 0 else cout, cout, indice_key, config))
            for i in range(count)
        )
    )


class SpconvSpUNet(nn.Module):
    """spconv twin of `SpUNet(config)`, with Pointcept's module names and spconv weights."""

    def __init__(self, config: SpUNetConfig):
        super().__init__()
        sp = _spconv()
        self.config = cfg = config
        n, stages = len(cfg.channels), range(cfg.num_stages)

        def conv_bn_relu(conv, channels):
            return sp.SparseSequential(conv, _bn(channels, cfg), nn.ReLU())

        self.conv_input = conv_bn_relu(
            sp.SubMConv3d(
                cfg.in_channels,
                cfg.base_channels,
                kernel_size=5,
                padding=1,
                bias=False,
                algo=native_algo(),
                indice_key="stem",
            ),
            cfg.base_channels,
        )
        self.down = nn.ModuleList(
            conv_bn_relu(
                sp.SparseConv3d(
                    cfg.enc_in(s),
                    cfg.channels[s],
                    kernel_size=2,
                    stride=2,
                    bias=False,
                    algo=native_algo(),
                    indice_key=f"spconv{s + 1}",
                ),
                cfg.channels[s],
            )
            for s in stages
        )
        self.enc = nn.ModuleList(
            _blocks(cfg.channels[s], cfg.channels[s], cfg.layers[s], f"subm{s + 1}", cfg)
            for s in stages
        )
        self.up = nn.ModuleList(
            conv_bn_relu(
                sp.SparseInverseConv3d(
                    cfg.channels[n - s - 2],
                    cfg.dec_channels(s),
                    kernel_size=2,
                    bias=False,
                    algo=native_algo(),
                    indice_key=f"spconv{s + 1}",
                ),
                cfg.dec_channels(s),
            )
            for s in stages
        )
        self.dec = nn.ModuleList(
            _blocks(
                cfg.dec_channels(s) + cfg.enc_in(s),
                cfg.dec_channels(s),
                cfg.dec_layers(s),
                f"subm{s}",
                cfg,
            )
            for s in stages
        )
        self.final = sp.SubMConv3d(
            cfg.channels[-1],
            cfg.num_classes,
            kernel_size=1,
            padding=1,
            bias=True,
            algo=native_algo(),
        )

    def forward(self, x):
        """x: spconv.SparseConvTensor [N, in_channels] -> the same rows, logits [N, classes]."""
        x = self.conv_input(x)
        skips = [x]
        for s in range(self.config.num_stages):
            x = self.enc[s](self.down[s](x))
            skips.append(x)
        x = skips.pop()
        for s in reversed(range(self.config.num_stages)):
            x = self.up[s](x)
            skip = skips.pop()
            if x.indices is not skip.indices and not torch.equal(x.indices, skip.indices):
                raise RuntimeError(f"up[{s}] output rows differ from the skip's rows")
            x = self.dec[s](x.replace_feature(torch.cat((x.features, skip.features), dim=1)))
        return self.final(x)
