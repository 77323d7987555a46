"""BatchNorm folding (models/fold.py) and the conv epilogue it relies on (bias, then ReLU, fused
into the CPU kernel in inference): the folded network must compute what the unfolded one does."""

from __future__ import annotations

import pytest
import torch

from kernels import submanifold_map
from kernels.engine import EngineConfig, sparse_conv
from kernels.tuning import GroupingTable
from models import SparseTensor
from models.fold import FoldedResidualBlock, fold_batchnorm
from models.layers import BatchNorm, ReLU
from models.minkunet import MinkUNet
from models.spunet import SpUNet, SpUNetConfig
from tests.conftest import FRAMES, ours_threads, randomize_batchnorm, rel_err, voxelized_frame

KITTI = FRAMES[0][0]


def grouped(deterministic: bool = False) -> EngineConfig:
    table = GroupingTable(
        entries={}, defaults={"cpu": (0.0, 0.0, "grouped"), "cuda": (0.0, 0.0, "grouped")}
    )
    return EngineConfig(deterministic=deterministic, grouping=table)


@pytest.mark.parametrize("cout", [16, 48, 24])  # 24: not a multiple of the vector width
def test_conv_epilogue_is_bias_residual_then_relu(cout):
    coords = voxelized_frame(KITTI, 0.2)
    kmap = submanifold_map(coords, None, 3)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(len(coords), 16, generator=gen)
    w = torch.randn(27, 16, cout, generator=gen) * 0.1
    b = torch.randn(cout, generator=gen)
    res = torch.randn(len(coords), cout, generator=gen)
    with torch.no_grad(), ours_threads():
        plain = sparse_conv(x, w, kmap, grouped())
        for config in (EngineConfig(), grouped()):
            out = sparse_conv(x, w, kmap, config, b, relu=True)
            assert rel_err(out, torch.relu(plain + b)) < 1e-6
            assert rel_err(sparse_conv(x, w, kmap, config, b), plain + b) < 1e-6
            out = sparse_conv(x, w, kmap, config, b, relu=True, residual=res)
            assert rel_err(out, torch.relu(plain + b + res)) < 1e-6
            out = sparse_conv(x, w, kmap, config, residual=res)
            assert rel_err(out, plain + res) < 1e-6
        with pytest.raises(ValueError, match="residual must be"):
            sparse_conv(x, w, kmap, EngineConfig(), residual=res[:-1])


def test_epilogue_keeps_gradients():
    coords = voxelized_frame(KITTI, 0.2)[:400]
    kmap = submanifold_map(coords, None, 3)
    x = torch.randn(len(coords), 3, dtype=torch.float64, requires_grad=True)
    w = (torch.randn(27, 3, 2, dtype=torch.float64) * 0.3).requires_grad_()
    b = torch.randn(2, dtype=torch.float64, requires_grad=True)
    r = torch.randn(len(coords), 2, dtype=torch.float64, requires_grad=True)
    # fast_mode: each gradient against one random direction of the numerical Jacobian, not
    # all 2,164 columns of it (18 s on a Zen 1 core)
    assert torch.autograd.gradcheck(
        lambda x, w, b, r: sparse_conv(x, w, kmap, EngineConfig(), b, True, r),
        (x, w, b, r),
        fast_mode=True,
    )


def _run(model, coords, feats):
    with torch.no_grad(), ours_threads():
        return model(SparseTensor(feats, coords)).feats


@pytest.mark.parametrize(
    "make", [lambda: MinkUNet(cr=0.25), lambda: SpUNet(SpUNetConfig())], ids=["minkunet", "spunet"]
)
def test_folded_network_matches_the_original(make):
    torch.manual_seed(0)
    model = randomize_batchnorm(make()).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    folded = fold_batchnorm(model)
    assert not any(isinstance(m, BatchNorm) for m in folded.modules())
    assert any(getattr(m, "relu", False) for m in folded.modules())
    assert any(isinstance(m, FoldedResidualBlock) for m in folded.modules())
    coords = voxelized_frame(KITTI, 0.2)
    feats = torch.randn(len(coords), 4, generator=torch.Generator().manual_seed(1))
    ref, out = _run(model, coords, feats), _run(folded, coords, feats)
    assert rel_err(out, ref) < 1e-5
    assert torch.equal(out.argmax(1), ref.argmax(1))
    # The original is untouched: same parameters, its BatchNorms and ReLUs still in place.
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert any(isinstance(m, BatchNorm) for m in model.modules())
    assert sum(type(m) is ReLU for m in model.modules()) > sum(
        type(m) is ReLU for m in folded.modules()
    )
