"""Pointcept SpUNet-v1m1 import (models/pointcept.py) into our SpUNet (models/spunet.py).

The reference is the spconv twin (models/spunet_twin.py), whose state_dict carries Pointcept's
key names and spconv's [Cout, K, K, K, Cin] weights: its random weights imported into our
SpUNet must give the same logits on a real frame. Key names and shapes of the default config are
also checked against a list written from Pointcept's source (spconv_unet_v1m1_base.py)."""

from __future__ import annotations

import functools

import pytest
import torch

from models.checkpoint_errors import CheckpointError, MissingKeyError
from models.pointcept import (
    export_pointcept,
    import_pointcept,
    infer_config,
    load_pointcept,
    pointcept_state_dict,
)
from models.sparse_tensor import SparseTensor
from models.spunet import SpUNet, SpUNetConfig
from tests.conftest import (
    load_frame,
    randomize_batchnorm,
    rel_err,
    require_real_data,
    single_thread,
)

FRAME = "semantickitti/seq00_000000.bin"
VOXEL = 0.2  # ~32k voxels: small enough for one CPU thread
REL_TOL = 1e-4
# Full depth (2, 3, 4, 6, 2, 2, 2, 2), half the default widths, for speed.
SMALL = SpUNetConfig(
    in_channels=4, num_classes=19, base_channels=16, channels=(16, 32, 64, 128, 128, 64, 48, 48)
)
# An uneven config: stage widths and depths all differ, so a swapped index shows as a shape.
ODD = SpUNetConfig(
    in_channels=5,
    num_classes=7,
    base_channels=8,
    channels=(8, 16, 24, 32, 40, 24, 16, 12),
    layers=(1, 2, 1, 3, 2, 1, 3, 1),
)


@functools.lru_cache(maxsize=None)
def twin(config: SpUNetConfig, seed: int = 0):
    """The spconv twin (eval mode) with spconv's random init, random BN affine parameters and
    running statistics, and a random `final` bias."""
    from models.spunet_twin import SpconvSpUNet

    torch.manual_seed(seed)
    model = randomize_batchnorm(SpconvSpUNet(config), 5)
    with torch.no_grad():
        model.final.bias.uniform_(-1.0, 1.0)
    return model.eval()


def _reference(config: SpUNetConfig) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in twin(config).state_dict().items()}


@functools.lru_cache(maxsize=None)
def frame_voxels():
    """(coords int32 [M, 4], feats [M, 4] mean x, y, z, intensity) of a real KITTI frame; the
    coordinates start at 0 on each axis, as Pointcept's GridSample leaves its grid_coord."""
    from app.inference.voxel_config import VoxelizeConfig
    from app.inference.voxelize import voxelize

    require_real_data()
    batch = voxelize([load_frame(FRAME)], VoxelizeConfig(voxel_size=VOXEL), "kitti")
    coords = batch.coords.clone()
    coords[:, 1:] -= coords[:, 1:].min(0).values
    return coords.contiguous(), batch.feats


# ---- names and shapes -------------------------------------------------------------------------

# Default SpUNet-v1m1 (in_channels 4, 19 classes): key -> spconv shape [Cout, K, K, K, Cin].
POINTCEPT_KEYS = {
    "conv_input.0.weight": (32, 5, 5, 5, 4),
    "conv_input.1.running_var": (32,),
    "down.0.0.weight": (32, 2, 2, 2, 32),
    "down.1.0.weight": (64, 2, 2, 2, 32),
    "down.3.1.num_batches_tracked": (),
    "enc.0.block0.conv1.weight": (32, 3, 3, 3, 32),
    "enc.3.block5.conv2.weight": (256, 3, 3, 3, 256),
    "enc.2.block3.bn2.running_mean": (128,),
    "up.3.0.weight": (256, 2, 2, 2, 256),  # enc[3] (256) -> channels[4] (256)
    "up.1.0.weight": (96, 2, 2, 2, 128),  # dec[2] (128) -> channels[6] (96)
    "up.0.0.weight": (96, 2, 2, 2, 96),
    "dec.3.block0.conv1.weight": (256, 3, 3, 3, 384),  # cat(up 256, skip enc[2] 128)
    "dec.3.block0.proj.0.weight": (256, 1, 1, 1, 384),
    "dec.3.block0.proj.1.bias": (256,),
    "dec.0.block0.proj.0.weight": (96, 1, 1, 1, 128),  # cat(up 96, skip conv_input 32)
    "dec.0.block1.conv2.weight": (96, 3, 3, 3, 96),
    "final.weight": (19, 1, 1, 1, 96),
    "final.bias": (19,),
}
NOT_POINTCEPT_KEYS = (
    "enc.0.block0.proj.0.weight",
    "dec.0.block1.proj.0.weight",
    "dec.0.block2.conv1.weight",
    "enc.0.block2.conv1.weight",
    "final.1.weight",
)


def test_default_keys_are_pointcept_keys(spconv):
    from models.spunet_twin import SpconvSpUNet

    with torch.device("meta"):  # shapes only, no 39M-parameter allocation
        ref = SpconvSpUNet(SpUNetConfig()).state_dict()
        ours = SpUNet(SpUNetConfig()).state_dict()
    # conv_input 6 + down 4*6 + up 4*6 + 15 enc blocks * 12 + 8 dec blocks * 12 + 4 proj * 6
    # + final 2 (a BN is 5 entries, a block conv1, bn1, conv2, bn2)
    assert len(ref) == 356
    for key, shape in POINTCEPT_KEYS.items():
        assert tuple(ref[key].shape) == shape, key
    assert not set(NOT_POINTCEPT_KEYS) & set(ref)
    assert set(ours) == set(ref)
    for key, v in ours.items():
        want = tuple(ref[key].shape)
        if v.dim() == 3:  # ours [K^3, Cin, Cout]
            want = (want[1] ** 3, want[4], want[0])
        assert tuple(v.shape) == want, key
    assert (
        sum(v.numel() for k, v in ref.items() if "running" not in k and "num_b" not in k)
        > 39_000_000
    )  # Pointcept quotes ~39M parameters
    assert infer_config(ref) == SpUNetConfig()


@pytest.mark.parametrize("config", [SMALL, ODD], ids=["small", "odd"])
def test_infer_config(spconv, config):
    assert infer_config(_reference(config)) == config


# ---- outputs ----------------------------------------------------------------------------------


def test_imported_spunet_matches_twin_on_real_frame(spconv):
    """Twin weights -> import -> our SpUNet: the same logits and labels on a real frame."""
    from models.spconv_twin import run_spconv

    coords, feats = frame_voxels()
    ref_model = twin(SMALL)
    ours = load_pointcept(ref_model.state_dict())  # config inferred from the shapes
    assert ours.config == SMALL and not ours.training
    with torch.no_grad(), single_thread():  # one thread: light on a shared CPU
        ref = run_spconv(ref_model, feats, coords)
        out = ours(SparseTensor(feats, coords))
    assert torch.equal(out.coords, coords) and out.feats.shape == (len(coords), 19)
    assert bool(torch.isfinite(ref).all()) and ref.abs().max() > 0
    err = rel_err(out.feats, ref)
    agree = (out.feats.argmax(1) == ref.argmax(1)).double().mean().item()
    print(
        f"\nSpUNet {FRAME} {VOXEL} m voxels={len(coords)}: rel err {err:.3e}, "
        f"max |diff| {(out.feats - ref).abs().max().item():.3e}, labels equal {agree:.6%}"
    )
    assert err <= REL_TOL
    assert agree == 1.0


def test_odd_config_matches_twin(spconv):
    """Uneven widths and depths, 5 input channels, on a small synthetic cloud."""
    from models.spconv_twin import run_spconv

    g = torch.Generator().manual_seed(3)
    xyz = torch.unique(torch.randint(0, 40, (3000, 3), generator=g), dim=0)
    coords = torch.cat([torch.zeros(len(xyz), 1, dtype=torch.int64), xyz], 1).int().contiguous()
    feats = torch.randn(len(xyz), 5, generator=g)
    ours = SpUNet(ODD)
    ours.load_state_dict(import_pointcept(_reference(ODD), ODD))
    with torch.no_grad(), single_thread():
        ref = run_spconv(twin(ODD), feats, coords)
        out = ours.eval()(SparseTensor(feats, coords)).feats
    assert rel_err(out, ref) <= REL_TOL


# ---- checkpoints, errors ----------------------------------------------------------------------


def test_pointcept_checkpoint_is_unwrapped(spconv):
    """Pointcept saves {"state_dict": DefaultSegmentor(backbone=SpUNet).state_dict()}, under DDP
    with "module."; spconv may add max_num_voxels_during_training buffers."""
    ref = _reference(SMALL)
    ckpt = {"epoch": 50, "state_dict": {f"module.backbone.{k}": v for k, v in ref.items()}}
    ckpt["state_dict"]["module.backbone.down.0.0.max_num_voxels_during_training"] = torch.zeros(
        1, dtype=torch.int32
    )
    assert set(pointcept_state_dict(ckpt)) == set(ref) | {"down.0.0.max_num_voxels_during_training"}
    back = import_pointcept(ckpt)
    direct = import_pointcept(ref, SMALL)
    assert set(back) == set(direct)
    for k, v in direct.items():
        assert torch.equal(back[k], v), k


@pytest.mark.parametrize(
    "key",
    ["dec.1.block0.proj.0.weight", "enc.2.block1.bn1.running_var", "final.bias", "up.2.1.weight"],
)
def test_missing_key_is_named(spconv, key):
    ref = _reference(SMALL)
    del ref[key]
    with pytest.raises(MissingKeyError, match=f"missing key '{key}'") as err:
        import_pointcept(ref)
    assert isinstance(err.value, KeyError)


@pytest.mark.parametrize("key", ["conv_input.0.weight", "final.weight", "up.0.0.weight"])
def test_missing_key_needed_for_inference_is_named(spconv, key):
    ref = _reference(SMALL)
    del ref[key]
    with pytest.raises(MissingKeyError, match=f"missing key '{key}'"):
        import_pointcept(ref)


def test_missing_num_batches_tracked_defaults_to_zero(spconv):
    ref = {k: v for k, v in _reference(SMALL).items() if not k.endswith("num_batches_tracked")}
    assert int(import_pointcept(ref, SMALL)["conv_input.1.num_batches_tracked"]) == 0


@pytest.mark.parametrize(
    "key,bad",
    [
        ("enc.1.block0.conv2.weight", lambda w: w.permute(1, 2, 3, 4, 0)),  # spconv 1.x order
        ("dec.2.block0.proj.0.weight", lambda w: w.reshape(1, w.shape[4], w.shape[0])),  # ours
        ("final.bias", lambda b: b[:-1]),
        ("down.2.1.running_mean", lambda v: torch.cat([v, v])),
    ],
)
def test_wrong_shape_is_named(spconv, key, bad):
    ref = _reference(SMALL)
    ref[key] = bad(ref[key]).contiguous()
    with pytest.raises(CheckpointError, match=f"wrong shape for key '{key}'"):
        import_pointcept(ref, SMALL)


def test_wrong_config_is_caught(spconv):
    ref = _reference(SMALL)
    with pytest.raises(CheckpointError, match="wrong shape for key 'conv_input.0.weight'"):
        import_pointcept(ref, SpUNetConfig())
    with pytest.raises(CheckpointError, match="unexpected keys"):
        import_pointcept(
            ref,
            SpUNetConfig(
                base_channels=16, channels=SMALL.channels, layers=(2, 3, 4, 5, 2, 2, 2, 2)
            ),
        )


def test_unexpected_keys_listed_unless_not_strict(spconv):
    ref = _reference(SMALL)
    ref["seg_head.weight"] = torch.zeros(19, 48)
    with pytest.raises(CheckpointError, match="1 unexpected keys") as err:
        import_pointcept(ref)
    assert "seg_head.weight" in str(err.value)
    assert set(import_pointcept(ref, strict=False)) == set(SpUNet(SMALL).state_dict())


# ---- export -----------------------------------------------------------------------------------


@pytest.mark.parametrize("config", [SMALL, ODD], ids=["small", "odd"])
def test_export_round_trip(spconv, config):
    """Pointcept -> ours -> Pointcept is the identity, and so is ours -> Pointcept -> ours."""
    ref = _reference(config)
    model = load_pointcept(ref)
    back = export_pointcept(model)
    assert list(back) == list(ref)
    for k, v in ref.items():
        assert back[k].dtype == v.dtype and torch.equal(back[k], v), k
    twin(config).load_state_dict(back)  # strict: spconv accepts it as is

    prefixed = export_pointcept(model, prefix="backbone.")
    assert all(k.startswith("backbone.") for k in prefixed)
    again = import_pointcept({"state_dict": prefixed})
    for k, v in model.state_dict().items():
        assert torch.equal(again[k], v), k


def test_new_modules_import_spconv_lazily():
    """`models.spunet`, `models.spunet_twin` and `models.pointcept` must not import spconv."""
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT

    code = (
        "import sys, models.spunet, models.spunet_twin, models.pointcept; "
        "assert not any(m == 'spconv' or m.startswith('spconv.') for m in sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(REPO_ROOT))
