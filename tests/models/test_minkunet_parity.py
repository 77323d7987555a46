"""Whole-network parity: our MinkUNet against its spconv 2.x twin (models/spconv_twin.py).

Eval mode, fp32, random init with a fixed seed, but with realistic, non-trivial BatchNorm: every
BN's running statistics are set from one train-mode pass over a calibration frame (momentum None,
so the running stats ARE that frame's batch statistics) and its affine parameters are perturbed,
so every BN is a real per-channel affine map. The same weights go to the twin through
ours_to_spconv_state_dict. Input features are (x, y, z, intensity), the mean over each voxel's
points, on the real frames of shared/data/real at 0.05 m.

Ours runs with two threads, spconv single-threaded (run_spconv sees to that: spconv issue #679).
Runtime on 2 busy cores: about 1-2 minutes, nearly all of it in the four ~100k-voxel frames.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from models.fold import fold_batchnorm
from models.minkunet import MinkUNet, MinkUNetConfig, minkunet34
from models.sparse_tensor import SparseTensor
from models.spconv_compat import weight_to_spconv
from tests.conftest import FRAMES, frame_id, load_frame, ours_threads, rel_err, voxelized_frame

REL_TOL = 1e-3
LABEL_AGREEMENT = 0.9999
VOXEL = 0.05
NUSCENES = next(name for name, _ in FRAMES if name.startswith("nuscenes/"))
CALIBRATION = (NUSCENES, 0.1)  # BN statistics come from this frame (small, fast)
SEED = 20240611

# cr 1.0 (the real width) on the first KITTI frame, cr 0.5 on the rest for speed.
CASES = [
    pytest.param(name, 1.0 if i == 0 else 0.5, id=f"{frame_id(name)}-cr{1.0 if i == 0 else 0.5}")
    for i, (name, _) in enumerate(FRAMES)
]


# ---- inputs -------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def voxel_mean_features(name: str, voxel_size: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(coords int32 [M, 4], feats float32 [M, 4]): voxelized_frame's coords (same rows) and
    the mean (x, y, z, intensity) of each voxel's points."""
    pts = torch.from_numpy(np.array(load_frame(name)[:, :4], dtype=np.float32))
    cell = torch.from_numpy(
        np.floor(load_frame(name)[:, :3] / np.float32(voxel_size)).astype(np.int64)
    )
    uniq, inverse = torch.unique(cell, dim=0, return_inverse=True)  # sorted, as voxelize
    coords = voxelized_frame(name, voxel_size)
    assert torch.equal(uniq.to(torch.int32), coords[:, 1:]), "voxel order differs from voxelize"
    sums = torch.zeros(len(uniq), 4, dtype=torch.float64).index_add_(0, inverse, pts.double())
    counts = torch.bincount(inverse, minlength=len(uniq)).double().unsqueeze(1)
    return coords, (sums / counts).float()


# ---- models -------------------------------------------------------------------------------------


def _calibrated(config: MinkUNetConfig, seed: int = SEED) -> MinkUNet:
    """MinkUNet(config) with a fixed random init, BN running stats from one train-mode pass over
    the calibration frame and perturbed BN affine parameters; returned in eval mode."""
    torch.manual_seed(seed)
    model = MinkUNet(config=config)
    bns = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm1d)]
    for bn in bns:
        bn.momentum = None  # cumulative average: after one pass = batch stats
    coords, feats = voxel_mean_features(*CALIBRATION)
    model.train()
    with torch.no_grad(), ours_threads():
        model(SparseTensor(feats, coords))
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for bn in bns:
            bn.momentum = config.bn_momentum
            bn.weight.copy_(torch.empty_like(bn.weight).uniform_(0.5, 1.5, generator=g))
            bn.bias.copy_(torch.empty_like(bn.bias).uniform_(-0.2, 0.2, generator=g))
    return model.eval()


@functools.lru_cache(maxsize=None)
def model_pair(config: MinkUNetConfig):
    """(ours, spconv twin) in eval mode with identical weights and BN state."""
    from models.spconv_twin import SpconvMinkUNet, ours_to_spconv_state_dict

    ours = _calibrated(config)
    twin = SpconvMinkUNet(config)
    twin.load_state_dict(ours_to_spconv_state_dict(ours.state_dict()))  # strict
    return ours, twin.eval()


def _bn_is_nontrivial(model: MinkUNet) -> None:
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.BatchNorm1d):
            assert not torch.allclose(m.running_mean, torch.zeros_like(m.running_mean)), name
            assert not torch.allclose(m.running_var, torch.ones_like(m.running_var)), name


def _parity(ours, twin, coords, feats):
    """(rel err, label agreement, max |logit|) of ours vs the twin on one input; ours is checked
    as trained and as the pipeline runs it (BatchNorm and residual blocks folded), the worse of
    the two counts."""
    from models.spconv_twin import run_spconv

    assert feats.dtype == torch.float32
    before = torch.get_num_threads()
    with torch.no_grad():
        with ours_threads():
            out = ours(SparseTensor(feats, coords))
        ref = run_spconv(twin, feats, coords)
    assert torch.get_num_threads() == before, "run_spconv did not restore the thread count"
    assert torch.equal(out.coords, coords) and out.stride == 1
    assert out.feats.shape == ref.shape == (len(coords), ours.config.num_classes)
    assert out.feats.dtype == ref.dtype == torch.float32
    assert bool(torch.isfinite(ref).all()) and ref.abs().max() > 0
    with torch.no_grad(), ours_threads():
        folded = fold_batchnorm(ours)(SparseTensor(feats, coords)).feats
    err = max(rel_err(out.feats, ref), rel_err(folded, ref))
    agree = min(
        (logits.argmax(1) == ref.argmax(1)).double().mean().item() for logits in (out.feats, folded)
    )
    return err, agree, ref.abs().max().item()


# ---- tests --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,cr", CASES)
def test_minkunet_matches_spconv_twin(spconv, name, cr):
    ours, twin = model_pair(MinkUNetConfig(cr=cr))
    _bn_is_nontrivial(ours)
    coords, feats = voxel_mean_features(name, VOXEL)
    err, agree, scale = _parity(ours, twin, coords, feats)
    print(
        f"\n{frame_id(name)} cr={cr} voxels={len(coords)}: rel err {err:.3e}, "
        f"labels equal {agree:.6%}, max |logit| {scale:.3g}"
    )
    assert err <= REL_TOL
    assert agree >= LABEL_AGREEMENT


def test_minkunet34_matches_spconv_twin(spconv):
    config = MinkUNetConfig(encoder_blocks=(2, 3, 4, 6))
    assert minkunet34().config == config
    ours, twin = model_pair(config)
    assert len(ours.encoder[3].blocks) == len(twin.encoder[3].blocks) == 6
    coords, feats = voxel_mean_features(NUSCENES, 0.1)
    err, agree, scale = _parity(ours, twin, coords, feats)
    print(
        f"\nMinkUNet34 nuscenes 0.1 m voxels={len(coords)}: rel err {err:.3e}, "
        f"labels equal {agree:.6%}, max |logit| {scale:.3g}"
    )
    assert err <= REL_TOL
    assert agree >= LABEL_AGREEMENT


def test_run_spconv_returns_input_row_order(spconv):
    """Permuting the input rows permutes the twin's logits the same way (and matches ours)."""
    from models.spconv_twin import run_spconv

    ours, twin = model_pair(MinkUNetConfig(cr=0.5))
    coords, feats = voxel_mean_features(NUSCENES, 0.2)
    perm = torch.randperm(len(coords), generator=torch.Generator().manual_seed(SEED))
    with torch.no_grad():
        ref = run_spconv(twin, feats, coords)
        ref_p = run_spconv(twin, feats[perm], coords[perm].contiguous())
        with ours_threads():
            out_p = ours(SparseTensor(feats[perm], coords[perm].contiguous())).feats
    assert rel_err(ref_p, ref[perm]) <= 1e-5
    assert rel_err(out_p, ref_p) <= REL_TOL


@pytest.mark.parametrize(
    "config",
    [
        MinkUNetConfig(),
        MinkUNetConfig(cr=0.5, in_channels=5, num_classes=7, encoder_blocks=(2, 3, 4, 6)),
    ],
    ids=["minkunet-cr1", "minkunet34-cr0.5-in5-k7"],
)
def test_weight_round_trip(spconv, config):
    """ours -> twin -> ours gives an identical state dict; twin -> ours -> twin likewise."""
    from models.spconv_twin import (
        SpconvMinkUNet,
        ours_to_spconv_state_dict,
        spconv_to_ours_state_dict,
    )

    torch.manual_seed(SEED)
    ours = MinkUNet(config=config)
    with torch.no_grad():  # make every BN entry distinctive
        for m in ours.modules():
            if isinstance(m, torch.nn.BatchNorm1d):
                m.running_mean.normal_()
                m.running_var.uniform_(0.5, 2.0)
                m.weight.normal_()
                m.bias.normal_()
                m.num_batches_tracked.fill_(3)
    sd = ours.state_dict()
    twin = SpconvMinkUNet(config)
    twin.load_state_dict(ours_to_spconv_state_dict(sd))  # strict: same keys, same shapes
    back = spconv_to_ours_state_dict(twin.state_dict())
    assert list(back) == list(sd)
    for k, v in sd.items():
        assert back[k].dtype == v.dtype and torch.equal(back[k], v), k
    again = MinkUNet(config=config)
    again.load_state_dict(back)

    # every conv went through weight_to_spconv, the 1x1 shortcuts with spconv's quirk
    twin_sd = twin.state_dict()
    n_1x1 = 0
    for k, v in sd.items():
        if k.endswith("weight") and v.dim() == 3:
            assert torch.equal(twin_sd[k], weight_to_spconv(v)), k
            n_1x1 += v.shape[0] == 1
    assert n_1x1 > 0

    # the other direction, from spconv's own initialisation
    torch.manual_seed(SEED + 1)
    fresh = SpconvMinkUNet(config)
    fresh_sd = fresh.state_dict()
    ours2 = MinkUNet(config=config)
    ours2.load_state_dict(spconv_to_ours_state_dict(fresh_sd))
    twin2 = SpconvMinkUNet(config)
    twin2.load_state_dict(ours_to_spconv_state_dict(ours2.state_dict()))
    for k, v in fresh_sd.items():
        assert torch.equal(twin2.state_dict()[k], v), k


def test_spconv_twin_is_imported_lazily():
    """`import models` and `import models.spconv_twin` must not import spconv."""
    import subprocess
    import sys

    code = (
        "import sys, models, models.spconv_twin; "
        "assert not any(m == 'spconv' or m.startswith('spconv.') for m in sys.modules)"
    )
    subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        cwd=str(__import__("tests.conftest", fromlist=["REPO_ROOT"]).REPO_ROOT),
    )
