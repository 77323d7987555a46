"""BatchNorm folding (models/fold.py) outside MinkUNet's own layer patterns: only a ReLU right
after a conv and its BatchNorm becomes the conv's epilogue; any other layer there stays."""

from __future__ import annotations

import torch
from torch import nn

from models import SparseTensor
from models.fold import fold_batchnorm
from models.layers import BatchNorm, ReLU, SubMConv3d
from tests.conftest import ours_threads, randomize_batchnorm, rel_err


def cloud(n: int = 300, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    xyz = torch.unique(torch.randint(0, 12, (n, 3), generator=gen, dtype=torch.int32), dim=0)
    return torch.cat([torch.zeros(len(xyz), 1, dtype=torch.int32), xyz], 1)


def run(model: nn.Module, coords: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
    with torch.no_grad(), ours_threads():
        return model(SparseTensor(feats, coords)).feats


def test_only_a_relu_after_the_pair_is_folded_into_the_conv():
    torch.manual_seed(0)
    model = randomize_batchnorm(
        nn.Sequential(
            SubMConv3d(4, 8, 3),
            BatchNorm(8),
            SubMConv3d(8, 8, 3),  # a conv, not a ReLU, after
            BatchNorm(8),
            ReLU(),  # the pair a ReLU follows
        )  # fmt: skip
    ).eval()
    folded = fold_batchnorm(model)
    kinds = [type(m).__name__ for m in folded]
    assert kinds == ["SubMConv3d", "Identity", "SubMConv3d", "Identity", "Identity"]
    assert not folded[0].relu and folded[2].relu
    coords = cloud()
    feats = torch.randn(len(coords), 4, generator=torch.Generator().manual_seed(1))
    ref = run(model, coords, feats)
    assert rel_err(run(folded, coords, feats), ref) < 1e-5
