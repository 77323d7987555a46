"""The MinkUNet of models/minkunet.py rebuilt on spconv 2.x: a reference twin for parity checks.

Same topology, same module tree and therefore the same state-dict keys as `MinkUNet`; only the
conv weight layout differs (ours [K^3, Cin, Cout], spconv [Cout, K, K, K, Cin]), converted by
`ours_to_spconv_state_dict` / `spconv_to_ours_state_dict` through weight_to_spconv /
weight_from_spconv (spconv's 1x1 quirk included). BatchNorm parameters, running statistics and
the Linear head are copied as they are.

spconv needs explicit indice keys where our CoordinateManager caches maps by level:
    "subm{s}"  the 3x3x3 submanifold map of tensor stride s (stem: s = 1), shared by every
               SubMConv3d k3 at that level (1x1 SubMConv3d needs no map: spconv runs a matmul);
    "down{s}"  the k2 s2 downsampling from stride s to 2s; the decoder's SparseInverseConv3d
               that goes back from 2s to s uses the same key, so it is its exact inverse and
               returns the fine level's rows in spconv's own order for that level.

`spconv` is imported lazily, so `import models` works without it. On the CPU spconv is only
correct single-threaded (spconv issue #679); `run_spconv` takes care of that.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from typing import Mapping

import torch
from torch import nn

from .minkunet import MinkUNetConfig
from .spconv_compat import native_algo, weight_from_spconv, weight_to_spconv

# 4 stride-2 downsamplings: coordinates must be shifted by, and the spatial shape rounded to,
# multiples of 2**4 so every level's floor(c / 2**k) agrees with ours and no voxel is dropped.
GRID_MULTIPLE = 16


def _spconv():
    import spconv.pytorch as spconv  # lazy: spconv is an optional dependency

    return spconv


def _bn(channels: int, config: MinkUNetConfig) -> nn.BatchNorm1d:
    return nn.BatchNorm1d(channels, eps=config.bn_eps, momentum=config.bn_momentum)


def _conv_bn_relu(conv: nn.Module, channels: int, config: MinkUNetConfig) -> nn.Module:
    return _spconv().SparseSequential(conv, _bn(channels, config), nn.ReLU())


class SpconvResidualBlock(nn.Module):
    """SubM k3, BN, ReLU, SubM k3, BN, + shortcut (identity or 1x1 SubM + BN), ReLU."""

    def __init__(self, cin: int, cout: int, stride: int, config: MinkUNetConfig):
        super().__init__()
        sp = _spconv()
        key = f"subm{stride}"
        self.net = sp.SparseSequential(
            sp.SubMConv3d(cin, cout, 3, bias=False, algo=native_algo(), indice_key=key),
            _bn(cout, config),
            nn.ReLU(),
            sp.SubMConv3d(cout, cout, 3, bias=False, algo=native_algo(), indice_key=key),
            _bn(cout, config),
        )
        self.shortcut = (
            nn.Identity()
            if cin == cout
            else sp.SparseSequential(
                sp.SubMConv3d(cin, cout, 1, bias=False, algo=native_algo()), _bn(cout, config)
            )
        )
        self.relu = nn.ReLU()

    def forward(self, x):
        out = self.net(x)
        return out.replace_feature(self.relu(out.features + self.shortcut(x).features))


def _residual_stack(cin: int, cout: int, blocks: int, stride: int, config: MinkUNetConfig):
    # nn.Sequential, not SparseSequential: the latter would hand our (non-spconv) blocks only
    # the features; each block takes and returns a SparseConvTensor.
    return nn.Sequential(
        *(SpconvResidualBlock(cin if i == 0 else cout, cout, stride, config) for i in range(blocks))
    )


class SpconvEncoderStage(nn.Module):
    def __init__(self, cin: int, cout: int, blocks: int, stride: int, config: MinkUNetConfig):
        """stride: tensor stride of the input; the output is on 2 * stride."""
        super().__init__()
        sp = _spconv()
        self.down = _conv_bn_relu(
            sp.SparseConv3d(
                cin, cin, 2, 2, bias=False, algo=native_algo(), indice_key=f"down{stride}"
            ),
            cin,
            config,
        )
        self.blocks = _residual_stack(cin, cout, blocks, 2 * stride, config)

    def forward(self, x):
        return self.blocks(self.down(x))


class SpconvDecoderStage(nn.Module):
    def __init__(
        self, cin: int, skip: int, cout: int, blocks: int, stride: int, config: MinkUNetConfig
    ):
        """stride: tensor stride of the output (the input is on 2 * stride)."""
        super().__init__()
        sp = _spconv()
        self.up = _conv_bn_relu(
            sp.SparseInverseConv3d(
                cin, cout, 2, bias=False, algo=native_algo(), indice_key=f"down{stride}"
            ),
            cout,
            config,
        )
        self.blocks = _residual_stack(cout + skip, cout, blocks, stride, config)

    def forward(self, x, skip):
        up = self.up(x)
        # The inverse conv returns the fine level's indices exactly (same tensor, same rows) as
        # the skip, so a plain feature concatenation is row for row.
        if up.indices is not skip.indices and not torch.equal(up.indices, skip.indices):
            raise RuntimeError("inverse conv output rows differ from the skip's rows")
        return self.blocks(up.replace_feature(torch.cat([up.features, skip.features], dim=1)))


class SpconvMinkUNet(nn.Module):
    """spconv twin of `MinkUNet(config=config)`: same module tree and state-dict keys."""

    def __init__(self, config: MinkUNetConfig):
        super().__init__()
        sp = _spconv()
        self.config = config
        cfg, cs = config, config.channels
        self.stem = sp.SparseSequential(
            _conv_bn_relu(
                sp.SubMConv3d(
                    cfg.in_channels, cs[0], 3, bias=False, algo=native_algo(), indice_key="subm1"
                ),
                cs[0],
                cfg,
            ),
            _conv_bn_relu(
                sp.SubMConv3d(cs[0], cs[0], 3, bias=False, algo=native_algo(), indice_key="subm1"),
                cs[0],
                cfg,
            ),
        )
        self.encoder = nn.ModuleList(
            SpconvEncoderStage(cs[i], cs[i + 1], cfg.encoder_blocks[i], 2**i, cfg) for i in range(4)
        )
        self.decoder = nn.ModuleList(
            SpconvDecoderStage(
                cs[4 + i], cs[3 - i], cs[5 + i], cfg.decoder_blocks[i], 2 ** (3 - i), cfg
            )
            for i in range(4)
        )
        self.head = nn.Linear(cs[8], cfg.num_classes)

    def forward(self, x):
        """x: spconv.SparseConvTensor [N, in_channels] -> the same rows, logits [N, classes]."""
        skips = [self.stem(x)]
        for stage in self.encoder:
            skips.append(stage(skips[-1]))
        y = skips.pop()
        for stage in self.decoder:
            y = stage(y, skips.pop())
        return y.replace_feature(self.head(y.features))


# ---- weight transfer --------------------------------------------------------------------------


def ours_to_spconv_state_dict(sd: Mapping[str, torch.Tensor]) -> "OrderedDict[str, torch.Tensor]":
    """A MinkUNet state dict -> the SpconvMinkUNet state dict of the same network.

    Conv weights (ours: 3-D [K^3, Cin, Cout]) go through weight_to_spconv; everything else
    (BN affine and running stats, num_batches_tracked, the Linear head) is copied as is."""
    return OrderedDict(
        (k, weight_to_spconv(v) if k.endswith("weight") and v.dim() == 3 else v.clone())
        for k, v in sd.items()
    )


def spconv_to_ours_state_dict(sd: Mapping[str, torch.Tensor]) -> "OrderedDict[str, torch.Tensor]":
    """A SpconvMinkUNet state dict -> the MinkUNet state dict; inverse of the above.

    Conv weights (spconv: 5-D [Cout, K, K, K, Cin]) go through weight_from_spconv."""
    return OrderedDict(
        (k, weight_from_spconv(v) if k.endswith("weight") and v.dim() == 5 else v.clone())
        for k, v in sd.items()
    )


# ---- running it -------------------------------------------------------------------------------


@contextlib.contextmanager
def num_threads(n: int):
    """Run the block with torch.set_num_threads(n), then restore the previous count."""
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def spconv_input(feats: torch.Tensor, coords: torch.Tensor):
    """(SparseConvTensor, shifted coords, shift [3]) for our (batch, x, y, z) int32 coords, which
    may be negative: shifted per axis by a multiple of 16 into [0, shape), the spatial shape
    rounded up to a multiple of 16 (4 stride-2 levels agree with ours, none drops a plane)."""
    sp = _spconv()
    if coords.dim() != 2 or coords.shape[1] != 4 or feats.shape[0] != coords.shape[0]:
        raise ValueError(
            f"expected coords [N, 4] and feats [N, C], got {tuple(coords.shape)} "
            f"and {tuple(feats.shape)}"
        )
    m = GRID_MULTIPLE
    xyz = coords[:, 1:].to(torch.int64)
    if len(xyz):
        lo, hi = xyz.min(0).values, xyz.max(0).values
    else:
        lo = hi = torch.zeros(3, dtype=torch.int64)
    shift = -torch.div(lo, m, rounding_mode="floor") * m
    shape = ((hi + shift + 1 + m - 1) // m * m).tolist()
    shifted = torch.cat([coords[:, :1].to(torch.int64), xyz + shift], 1).to(torch.int32)
    batch_size = int(coords[:, 0].max().item()) + 1 if len(coords) else 1
    x = sp.SparseConvTensor(feats, shifted.contiguous(), shape, batch_size)
    return x, shifted, shift


def run_spconv(model: SpconvMinkUNet, feats: torch.Tensor, coords: torch.Tensor) -> torch.Tensor:
    """Per-voxel logits [N, num_classes] of the spconv twin, rows in the INPUT order of coords.

    On the CPU it runs with torch.set_num_threads(1) (spconv issue #679) and restores the
    previous thread count afterwards."""
    x, shifted, _ = spconv_input(feats, coords)
    ctx = num_threads(1) if feats.device.type == "cpu" else contextlib.nullcontext()
    with ctx:
        out = model(x)
    if out.indices is shifted or torch.equal(out.indices, shifted):
        return out.features

    # Not expected (the last inverse conv returns the input rows), but never return rows in
    # another order: match them back by coordinate.
    def key(c):
        c = c.to(torch.int64)
        return ((c[:, 0] * (1 << 20) + c[:, 1]) * (1 << 20) + c[:, 2]) * (1 << 20) + c[:, 3]

    k_out, k_in = key(out.indices), key(shifted)
    s_out, p_out = torch.sort(k_out)
    s_in, p_in = torch.sort(k_in)
    if not torch.equal(s_out, s_in):
        raise RuntimeError("spconv output coordinates differ from the input coordinates")
    rows = torch.empty_like(p_in)
    rows[p_in] = p_out
    return out.features[rows]
