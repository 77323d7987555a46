"""models/checkpoints.py and models/checkpoint_meta.py at their edges: colour values of 0 and
255, an intensity divisor of zero, an input feature count other than the first conv's, integer
buffers stored as they are under fp16 storage, a weight of the wrong shape, a newer version."""

from __future__ import annotations

import pytest
import torch

from models.checkpoint_errors import CheckpointError
from models.checkpoint_meta import check_meta, intensity_scales, make_meta
from models.checkpoints import load_checkpoint, load_state_exact, save_checkpoint
from tests.models.checkpoint_helpers import random_minkunet


def test_colour_values_0_and_255_are_in_range():
    colors = [(0, 0, 0), (255, 255, 255)]
    assert check_meta(make_meta(["a", "b"], colors), 2)["class_colors"] == [[0, 0, 0], [255] * 3]
    with pytest.raises(CheckpointError, match="class_colors"):
        check_meta(make_meta(["a", "b"], [(0, 0, 0), (256, 0, 0)]), 2)


@pytest.mark.parametrize("rule", ["0-255 -> /0", "0-255 -> /0.0"])
def test_an_intensity_divisor_of_zero_is_a_checkpoint_error(rule):
    with pytest.raises(CheckpointError, match="intensity_normalisation"):
        intensity_scales({"kitti": rule})
    assert intensity_scales({"kitti": "0-255 -> /255"}) == {"kitti": 1 / 255}


def test_the_input_features_must_be_the_first_convs_in_channels():
    meta = make_meta(input_features=("x", "y", "z"))
    assert check_meta(meta, 19)["input_features"] == ["x", "y", "z"]
    with pytest.raises(CheckpointError, match="has 3 features .* in_channels is 4"):
        check_meta(meta, 19, in_channels=4)


@pytest.fixture(scope="module")
def model():
    return random_minkunet()


def test_fp16_storage_keeps_integer_buffers(tmp_path, model):
    save_checkpoint(tmp_path / "m.pt", model, make_meta(), half=True)
    state = torch.load(tmp_path / "m.pt", weights_only=True)["state_dict"]
    counters = [k for k in state if k.endswith("num_batches_tracked")]
    assert counters and all(state[k].dtype == torch.int64 for k in counters)
    assert state["head.weight"].dtype == torch.float16


def test_a_weight_of_another_shape_is_a_checkpoint_error(model):
    state = dict(model.state_dict())
    state["head.weight"] = state["head.weight"][:, :-1]
    with pytest.raises(CheckpointError, match="'head.weight' has shape"):
        load_state_exact(model, state, "here")


def test_a_newer_checkpoint_version_is_refused(tmp_path, model):
    save_checkpoint(tmp_path / "m.pt", model, make_meta())
    ckpt = torch.load(tmp_path / "m.pt", weights_only=True)
    ckpt["version"] = 2
    torch.save(ckpt, tmp_path / "v2.pt")
    with pytest.raises(CheckpointError, match="version 2 is not supported"):
        load_checkpoint(tmp_path / "v2.pt")
