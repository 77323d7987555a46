"""Shared by the checkpoint, importer and kernel-order tests of tests/models: a small but
complete MinkUNet config, a random MinkUNet of it and a random sparse cloud."""

from __future__ import annotations

import torch

from models.minkunet import MinkUNet, MinkUNetConfig
from tests.conftest import randomize_batchnorm

# Small but complete: stage 0 keeps its width (identity shortcut), later stages widen (1x1
# shortcut), two-block stages exercise block indices > 0.
CFG = MinkUNetConfig(
    in_channels=4, num_classes=19, cr=0.25, encoder_blocks=(2, 2, 1, 1), decoder_blocks=(1, 1, 1, 2)
)


def random_cloud(n: int = 400, extent: int = 8, channels: int = 4, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    xyz = torch.unique(torch.randint(-extent, extent, (n, 3), generator=g), dim=0)
    coords = torch.cat([torch.zeros(len(xyz), 1, dtype=torch.int64), xyz], 1).to(torch.int32)
    return coords.contiguous(), torch.randn(len(xyz), channels, generator=g)


def random_minkunet(seed: int = 1) -> MinkUNet:
    """A MinkUNet with non-trivial BN statistics and affine parameters, in eval mode."""
    torch.manual_seed(seed)
    return randomize_batchnorm(MinkUNet(config=CFG), 7).eval()
