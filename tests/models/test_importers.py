"""The reference state-dict importers (models/importers.py, models/reference_layouts.py):
names and layouts, and the errors for Pointcept, missing, misshapen and unexpected keys."""

from __future__ import annotations

import pytest
import torch

from models.checkpoint_errors import CheckpointError, MissingKeyError
from models.importers import LAYOUTS, export_state_dict, import_model, import_state_dict, key_map
from models.minkunet import MinkUNetConfig
from tests.models.checkpoint_helpers import CFG, random_minkunet

IMPORTABLE = ("spconv-mmdet3d", "torchsparse-mmdet3d", "torchsparse-spvnas")


@pytest.fixture(scope="module")
def model():
    return random_minkunet()


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
    """Spot checks of the reference names / layouts (sources: models/reference_layouts.py)."""
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
