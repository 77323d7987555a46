"""Our checkpoint format: save / load round trips, fp16 storage, the meta and its validation,
and the files load_checkpoint refuses."""

from __future__ import annotations

import itertools

import pytest
import torch

from models import SparseTensor
from models.checkpoint_errors import CheckpointError
from models.checkpoint_meta import make_meta
from models.checkpoints import load_checkpoint, save_checkpoint
from models.importers import export_state_dict
from models.labels import SEMANTIC_KITTI_CLASSES, SEMANTIC_KITTI_COLORS
from models.minkunet import MinkUNet
from tests.conftest import ours_threads
from tests.models.checkpoint_helpers import CFG, random_cloud, random_minkunet


def _forward(model: MinkUNet, coords, feats) -> torch.Tensor:
    with torch.no_grad(), ours_threads():
        return model(SparseTensor(feats, coords)).feats


@pytest.fixture(scope="module")
def model():
    return random_minkunet()


# ---- our format -------------------------------------------------------------------------------


@pytest.mark.parametrize("half", [False, True], ids=["fp32", "fp16"])
def test_save_load_round_trip(tmp_path, half):
    model = random_minkunet()
    if half:  # make every float exactly fp16-representable, so fp16 storage is lossless
        with torch.no_grad():
            for t in itertools.chain(model.parameters(), model.buffers()):
                if t.is_floating_point():
                    t.copy_(t.half().float())
    coords, feats = random_cloud()
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
    sd = dict(good["state_dict"])  # one NaN weight: loaded and served a third of labels wrong
    sd["head.bias"] = sd["head.bias"].clone()
    sd["head.bias"][0] = float("nan")
    torch.save({**good, "state_dict": sd}, tmp_path / "nan.pt")
    with pytest.raises(CheckpointError, match="'head.bias' holds NaN"):
        load_checkpoint(tmp_path / "nan.pt")


def test_meta_is_validated(tmp_path, model):
    with pytest.raises(CheckpointError, match="class_names"):
        save_checkpoint(tmp_path / "m.pt", model, make_meta(SEMANTIC_KITTI_CLASSES[:5]))
    meta = make_meta()
    del meta["voxel_size"]
    with pytest.raises(CheckpointError, match="voxel_size"):
        save_checkpoint(tmp_path / "m.pt", model, meta)
    with pytest.raises(CheckpointError, match="class_colors"):
        save_checkpoint(tmp_path / "m.pt", model, make_meta(class_colors=[(0, 0, 300)] * 19))
