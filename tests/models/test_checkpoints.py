"""Our checkpoint format (save / load round trips, fp16 storage, validation) and the reference
state-dict importers (names, layouts, kernel order against an independent oracle, errors)."""

from __future__ import annotations

import itertools

import pytest
import torch

from models import SparseInverseConv3d, SparseTensor
from models.checkpoints import (
    CheckpointError,
    MissingKeyError,
    load_checkpoint,
    make_meta,
    save_checkpoint,
)
from models.importers import LAYOUTS, export_state_dict, import_model, import_state_dict, key_map
from models.labels import SEMANTIC_KITTI_CLASSES, SEMANTIC_KITTI_COLORS
from models.torchsparse_compat import weight_from_torchsparse, weight_to_torchsparse
from models.minkunet import MinkUNet, MinkUNetConfig
from tests.conftest import ours_threads, randomize_batchnorm

# Small but complete: stage 0 keeps its width (identity shortcut), later stages widen (1x1
# shortcut), two-block stages exercise block indices > 0.
CFG = MinkUNetConfig(
    in_channels=4, num_classes=19, cr=0.25, encoder_blocks=(2, 2, 1, 1), decoder_blocks=(1, 1, 1, 2)
)
IMPORTABLE = ("spconv-mmdet3d", "torchsparse-mmdet3d", "torchsparse-spvnas")


def _cloud(n: int = 400, extent: int = 8, channels: int = 4, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    xyz = torch.unique(torch.randint(-extent, extent, (n, 3), generator=g), dim=0)
    coords = torch.cat([torch.zeros(len(xyz), 1, dtype=torch.int64), xyz], 1).to(torch.int32)
    return coords.contiguous(), torch.randn(len(xyz), channels, generator=g)


def _model(seed: int = 1) -> MinkUNet:
    """A MinkUNet with non-trivial BN statistics and affine parameters, in eval mode."""
    torch.manual_seed(seed)
    return randomize_batchnorm(MinkUNet(config=CFG), 7).eval()


def _forward(model: MinkUNet, coords, feats) -> torch.Tensor:
    with torch.no_grad(), ours_threads():
        return model(SparseTensor(feats, coords)).feats


@pytest.fixture(scope="module")
def model():
    return _model()


# ---- our format -------------------------------------------------------------------------------


@pytest.mark.parametrize("half", [False, True], ids=["fp32", "fp16"])
def test_save_load_round_trip(tmp_path, half):
    model = _model()
    if half:  # make every float exactly fp16-representable, so fp16 storage is lossless
        with torch.no_grad():
            for t in itertools.chain(model.parameters(), model.buffers()):
                if t.is_floating_point():
                    t.copy_(t.half().float())
    coords, feats = _cloud()
    ref = _forward(model, coords, feats)
    meta = make_meta(training_data="synthetic", version="test-1")
    path = tmp_path / "m.pt"
    save_checkpoint(path, model, meta, half=half)

    raw = torch.load(path, weights_only=True)
    assert raw["format"] == "lidarseg-checkpoint" and raw["version"] == 1
    assert raw["model"] == {
        "arch": "MinkUNet",
        "in_channels": 4,
        "num_classes": 19,
        "cr": 0.25,
        "encoder_blocks": [2, 2, 1, 1],
        "decoder_blocks": [1, 1, 1, 2],
        "bn_eps": 1e-5,
        "bn_momentum": 0.1,
    }
    floats = {v.dtype for v in raw["state_dict"].values() if v.is_floating_point()}
    assert floats == {torch.float16 if half else torch.float32}
    assert raw["state_dict"]["stem.0.1.num_batches_tracked"].dtype == torch.int64

    loaded, meta2 = load_checkpoint(path)
    assert not loaded.training and loaded.config == CFG
    assert all(p.dtype == torch.float32 for p in loaded.parameters())
    for k, v in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    assert torch.equal(_forward(loaded, coords, feats), ref)
    assert meta2 == meta
    assert meta2["class_names"] == list(SEMANTIC_KITTI_CLASSES)
    assert meta2["voxel_size"] == 0.05
    assert meta2["input_features"] == ["x", "y", "z", "intensity"]
    assert meta2["intensity_normalisation"] == {
        "kitti": "0-1",
        "nuscenes": "0-255 -> /255",
        "ouster": "0-255 -> /255",
    }


def test_semantic_kitti_constants():
    assert len(SEMANTIC_KITTI_CLASSES) == 19 == len(SEMANTIC_KITTI_COLORS)
    assert SEMANTIC_KITTI_CLASSES[0] == "car" and SEMANTIC_KITTI_CLASSES[-1] == "traffic-sign"
    assert SEMANTIC_KITTI_CLASSES[8] == "road" and SEMANTIC_KITTI_CLASSES[14] == "vegetation"
    assert all(len(c) == 3 and all(0 <= v <= 255 for v in c) for c in SEMANTIC_KITTI_COLORS)


def test_load_rejects_other_files(tmp_path, model):
    path = tmp_path / "m.pt"
    save_checkpoint(path, model, make_meta())
    good = torch.load(path, weights_only=True)

    torch.save(export_state_dict(model.state_dict(), "spconv-mmdet3d", CFG), tmp_path / "r.pt")
    with pytest.raises(CheckpointError, match="not a lidarseg checkpoint"):
        load_checkpoint(tmp_path / "r.pt")
    torch.save({**good, "version": 2}, tmp_path / "v2.pt")
    with pytest.raises(CheckpointError, match="version 2 is not supported"):
        load_checkpoint(tmp_path / "v2.pt")
    torch.save({**good, "model": {**good["model"], "arch": "SpUNet"}}, tmp_path / "a.pt")
    with pytest.raises(CheckpointError, match="arch 'SpUNet'"):
        load_checkpoint(tmp_path / "a.pt")
    sd = dict(good["state_dict"])
    del sd["head.bias"]
    torch.save({**good, "state_dict": sd}, tmp_path / "k.pt")
    with pytest.raises(KeyError, match="head.bias"):
        load_checkpoint(tmp_path / "k.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a torch file")
    with pytest.raises(CheckpointError):
        load_checkpoint(tmp_path / "junk.pt")


def test_meta_is_validated(tmp_path, model):
    with pytest.raises(CheckpointError, match="class_names"):
        save_checkpoint(tmp_path / "m.pt", model, make_meta(SEMANTIC_KITTI_CLASSES[:5]))
    meta = make_meta()
    del meta["voxel_size"]
    with pytest.raises(CheckpointError, match="voxel_size"):
        save_checkpoint(tmp_path / "m.pt", model, meta)
    with pytest.raises(CheckpointError, match="class_colors"):
        save_checkpoint(tmp_path / "m.pt", model, make_meta(class_colors=[(0, 0, 300)] * 19))


# ---- importers: names and layouts -------------------------------------------------------------


@pytest.mark.parametrize("layout", IMPORTABLE)
def test_import_inverts_export(layout, model):
    ours = model.state_dict()
    assert set(key_map(layout, CFG)) == set(ours)  # every parameter and buffer, once
    ref = export_state_dict(ours, layout, CFG)
    assert len(ref) == len(ours)
    back = import_state_dict(ref, layout, CFG)
    assert set(back) == set(ours)
    for k, v in ours.items():
        assert back[k].dtype == v.dtype and torch.equal(back[k], v), k


def test_reference_names_and_shapes(model):
    """Spot checks of the reference names / layouts (see the module docstring for sources)."""
    cs = CFG.channels
    sp = export_state_dict(model.state_dict(), "spconv-mmdet3d", CFG)
    assert sp["backbone.conv_input.0.0.weight"].shape == (cs[0], 3, 3, 3, 4)  # [Cout,K,K,K,Cin]
    assert sp["backbone.encoder.0.0.0.weight"].shape == (cs[0], 2, 2, 2, cs[0])
    assert "backbone.encoder.0.1.downsample.0.weight" not in sp  # 8 -> 8
    assert sp["backbone.encoder.1.1.downsample.0.weight"].shape == (cs[2], 1, 1, 1, cs[1])
    assert sp["backbone.encoder.1.2.bn2.running_var"].shape == (cs[2],)
    assert sp["backbone.decoder.0.0.0.weight"].shape == (cs[5], 2, 2, 2, cs[4])
    assert sp["backbone.decoder.3.1.1.conv2.weight"].shape == (cs[8], 3, 3, 3, cs[8])
    assert sp["decode_head.conv_seg.weight"].shape == (19, cs[8])

    tm = export_state_dict(model.state_dict(), "torchsparse-mmdet3d", CFG)
    assert tm["backbone.conv_input.1.net.0.kernel"].shape == (27, cs[0], cs[0])
    assert tm["backbone.encoder.2.1.downsample.0.kernel"].shape == (cs[2], cs[3])  # 1x1
    assert tm["backbone.decoder.1.0.net.0.kernel"].shape == (8, cs[5], cs[6])
    assert "backbone.decoder.1.1.0.net.4.num_batches_tracked" in tm

    sv = export_state_dict(model.state_dict(), "torchsparse-spvnas", CFG)
    assert sv["stem.3.kernel"].shape == (27, cs[0], cs[0])
    assert sv["stage4.0.net.0.kernel"].shape == (8, cs[3], cs[3])
    assert sv["up4.1.0.downsample.0.kernel"].shape == (cs[8] + cs[0], cs[8])
    assert sv["classifier.0.bias"].shape == (19,)


def test_spvnas_unused_point_transforms_are_dropped(model):
    ref = export_state_dict(model.state_dict(), "torchsparse-spvnas", CFG)
    ref["point_transforms.0.0.weight"] = torch.zeros(64, 8)
    ref["point_transforms.0.1.running_mean"] = torch.zeros(64)
    back = import_state_dict(ref, "torchsparse-spvnas", CFG)
    assert set(back) == set(model.state_dict())
    # and a DataParallel-wrapped SPVNAS checkpoint {"model": {"module.…": …}} loads whole
    wrapped = {"model": {f"module.{k}": v for k, v in ref.items()}}
    imported = import_model(wrapped, "torchsparse-spvnas", CFG)
    assert torch.equal(imported.head.weight, model.head.weight)


def test_pointcept_is_refused_with_the_reason(model):
    """Pointcept's SpUNet is not a MinkUNet: the MinkUNet importers refuse it and point at
    models.pointcept (tests/models/test_pointcept_import.py covers that importer)."""
    with pytest.raises(CheckpointError, match="kernel 5") as err:
        import_state_dict({}, "spconv-pointcept", CFG)
    assert "models.pointcept.import_pointcept" in str(err.value)
    with pytest.raises(CheckpointError, match="SpUNet"):
        export_state_dict(model.state_dict(), "spconv-pointcept", CFG)
    with pytest.raises(CheckpointError, match="import_pointcept"):
        key_map("spconv-pointcept", CFG)
    with pytest.raises(ValueError, match="unknown layout"):
        import_state_dict({}, "minkowski", CFG)
    assert "spconv-pointcept" in LAYOUTS


@pytest.mark.parametrize(
    "layout,key,ours",
    [
        ("spconv-mmdet3d", "backbone.encoder.0.1.conv1.weight", "encoder.0.blocks.0.net.0.weight"),
        (
            "torchsparse-mmdet3d",
            "backbone.decoder.2.0.net.1.running_var",
            "decoder.2.up.1.running_var",
        ),
        (
            "torchsparse-spvnas",
            "up4.1.0.downsample.0.kernel",
            "decoder.3.blocks.0.shortcut.0.weight",
        ),
    ],
)
def test_missing_key_names_both_keys(layout, key, ours, model):
    ref = export_state_dict(model.state_dict(), layout, CFG)
    del ref[key]
    with pytest.raises(MissingKeyError) as err:
        import_state_dict(ref, layout, CFG)
    assert isinstance(err.value, KeyError)
    assert f"missing key '{key}' for '{ours}'" in str(err.value)


def test_missing_num_batches_tracked_defaults_to_zero(model):
    ref = export_state_dict(model.state_dict(), "spconv-mmdet3d", CFG)
    ref = {k: v for k, v in ref.items() if not k.endswith("num_batches_tracked")}
    back = import_state_dict(ref, "spconv-mmdet3d", CFG)
    assert int(back["stem.0.1.num_batches_tracked"]) == 0


@pytest.mark.parametrize(
    "layout,key",
    [
        ("spconv-mmdet3d", "backbone.conv_input.0.0.weight"),
        ("torchsparse-spvnas", "stage2.1.downsample.0.kernel"),
        ("torchsparse-mmdet3d", "decode_head.conv_seg.weight"),
    ],
)
def test_wrong_shape_names_the_key(layout, key, model):
    ref = export_state_dict(model.state_dict(), layout, CFG)
    ref[key] = ref[key].transpose(0, -1).contiguous()  # e.g. spconv 1.x [K,K,K,Cin,Cout] order
    with pytest.raises(ValueError, match=f"wrong shape for key '{key}'"):
        import_state_dict(ref, layout, CFG)


def test_unexpected_keys_listed_unless_not_strict(model):
    ref = export_state_dict(model.state_dict(), "spconv-mmdet3d", CFG)
    ref["backbone.extra.weight"] = torch.zeros(3)
    ref["auxiliary_head.conv_seg.bias"] = torch.zeros(3)
    with pytest.raises(ValueError, match="2 unexpected keys") as err:
        import_state_dict(ref, "spconv-mmdet3d", CFG)
    assert "backbone.extra.weight" in str(err.value)
    assert "auxiliary_head.conv_seg.bias" in str(err.value)
    back = import_state_dict(ref, "spconv-mmdet3d", CFG, strict=False)
    assert set(back) == set(model.state_dict())


def test_wrong_config_is_caught(model):
    ref = export_state_dict(model.state_dict(), "torchsparse-spvnas", CFG)
    wider = MinkUNetConfig(cr=0.5, encoder_blocks=(2, 2, 1, 1), decoder_blocks=(1, 1, 1, 2))
    with pytest.raises(ValueError, match="wrong shape"):
        import_state_dict(ref, "torchsparse-spvnas", wider)
    with pytest.raises(KeyError, match="missing key"):
        import_state_dict(ref, "torchsparse-spvnas", MinkUNetConfig(cr=0.25))


# ---- torchsparse kernel order against an independent oracle -----------------------------------
# torchsparse (nn/utils/kernel.py get_kernel_offsets): per-axis offsets arange(-K//2+1, K//2+1);
# odd K^3 lists [x, y, z] for z, then y, then x innermost (x fastest); even K^3 lists them for x,
# then y, then z innermost. The oracle below indexes a torchsparse kernel by that list only.


def _ts_offsets(k: int) -> list[tuple[int, int, int]]:
    r = list(range(-k // 2 + 1, k // 2 + 1))
    if k**3 % 2 == 1:
        return [(x, y, z) for z in r for y in r for x in r]
    return [(x, y, z) for x in r for y in r for z in r]


def _one_offset_kernel(k: int, offset, cin: int, cout: int, seed: int):
    """torchsparse-layout kernel, zero except at `offset`; returns (kernel, that matrix)."""
    g = torch.Generator().manual_seed(seed)
    m = torch.randn(cin, cout, generator=g)
    w = torch.zeros(k**3, cin, cout)
    w[_ts_offsets(k).index(tuple(offset))] = m
    return w, m


def _rows(coords: torch.Tensor) -> dict[tuple[int, ...], int]:
    return {tuple(c): i for i, c in enumerate(coords.tolist())}


def test_torchsparse_offsets_are_asymmetric_enough():
    """The chosen offsets would land elsewhere under the other enumeration order, so a wrong
    axis order cannot pass the oracle tests."""
    r3 = [(a - 1, b - 1, c - 1) for a in range(3) for b in range(3) for c in range(3)]  # ours
    assert r3[_ts_offsets(3).index((1, 0, -1))] != (1, 0, -1)
    r2 = [(z, y, x) for x in range(2) for y in range(2) for z in range(2)]  # reversed
    assert r2[_ts_offsets(2).index((1, 1, 0))] != (1, 1, 0)


def test_torchsparse_subm_kernel_order_oracle(model):
    """SPVNAS stem conv (K = 3) with one non-zero offset d: out[q] = in[q + d] @ M."""
    d = (1, 0, -1)
    ref = export_state_dict(model.state_dict(), "torchsparse-spvnas", CFG)
    cs0 = CFG.channels[0]
    ref["stem.0.kernel"], m = _one_offset_kernel(3, d, 4, cs0, seed=3)
    imported = import_model(ref, "torchsparse-spvnas", CFG)
    coords, feats = _cloud(seed=4)
    with torch.no_grad(), ours_threads():
        out = imported.stem[0][0](SparseTensor(feats, coords)).feats
    rows = _rows(coords)
    expected = torch.zeros(len(coords), cs0)
    for i, (b, x, y, z) in enumerate(coords.tolist()):
        j = rows.get((b, x + d[0], y + d[1], z + d[2]))
        if j is not None:
            expected[i] = feats[j] @ m
    assert (expected != 0).any(dim=1).sum() > 10  # the offset actually hits neighbours
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_torchsparse_down_kernel_order_oracle(model):
    """mmdet3d-torchsparse encoder[0] down conv (K = 2, stride 2), one offset d:
    out[p] = in[2p + d] @ M."""
    d = (1, 1, 0)
    ref = export_state_dict(model.state_dict(), "torchsparse-mmdet3d", CFG)
    cs0 = CFG.channels[0]
    ref["backbone.encoder.0.0.net.0.kernel"], m = _one_offset_kernel(2, d, cs0, cs0, seed=5)
    imported = import_model({"state_dict": ref}, "torchsparse-mmdet3d", CFG)
    coords, _ = _cloud(seed=6)
    feats = torch.randn(len(coords), cs0, generator=torch.Generator().manual_seed(7))
    with torch.no_grad(), ours_threads():
        y = imported.encoder[0].down[0](SparseTensor(feats, coords))
    rows = _rows(coords)
    expected = torch.zeros(len(y.coords), cs0)
    for i, (b, x, yy, z) in enumerate(y.coords.tolist()):
        j = rows.get((b, 2 * x + d[0], 2 * yy + d[1], 2 * z + d[2]))
        if j is not None:
            expected[i] = feats[j] @ m
    assert (expected != 0).any(dim=1).sum() > 10
    torch.testing.assert_close(y.feats, expected, rtol=1e-5, atol=1e-5)


def test_torchsparse_transposed_kernel_order_oracle(model):
    """Up conv (torchsparse transposed Conv3d, K = 2), one offset d: out[q] = in[p] @ M for the
    fine q = 2p + d, zero for the other fine rows."""
    d = (0, 1, 1)
    coords, feats = _cloud(seed=8)
    down = model.encoder[0].down[0]
    cs0 = CFG.channels[0]
    feats = torch.randn(len(coords), cs0, generator=torch.Generator().manual_seed(9))
    w, m = _one_offset_kernel(2, d, cs0, 5, seed=10)
    up = SparseInverseConv3d(cs0, 5, 2)
    with torch.no_grad():
        up.weight.copy_(weight_from_torchsparse(w))
        with ours_threads():
            coarse = down(SparseTensor(feats, coords))
            fine = up(coarse)
    assert torch.equal(fine.coords, coords)
    rows = _rows(coarse.coords)
    expected = torch.zeros(len(coords), 5)
    for i, (b, x, y, z) in enumerate(coords.tolist()):
        if (x % 2, y % 2, z % 2) == d:
            expected[i] = coarse.feats[rows[(b, x // 2, y // 2, z // 2)]] @ m
    assert (expected != 0).any(dim=1).sum() > 10
    torch.testing.assert_close(fine.feats, expected, rtol=1e-5, atol=1e-5)


def test_torchsparse_weight_helpers():
    w = torch.randn(27, 2, 3)
    assert torch.equal(weight_to_torchsparse(weight_from_torchsparse(w)), w)
    assert not torch.equal(weight_from_torchsparse(w), w)
    w2 = torch.randn(8, 2, 3)
    assert torch.equal(weight_from_torchsparse(w2), w2)  # even K: same order
    w1 = torch.randn(2, 3)
    assert weight_from_torchsparse(w1).shape == (1, 2, 3)
    assert torch.equal(weight_to_torchsparse(weight_from_torchsparse(w1)), w1)
    with pytest.raises(ValueError):
        weight_from_torchsparse(torch.randn(26, 2, 3))
