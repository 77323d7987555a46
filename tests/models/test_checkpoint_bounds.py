"""Checkpoint checks at their edges (models/checkpoint_meta.py, models/checkpoints.py): a voxel
size of 0, an intensity rule dividing by 0, an infinite weight."""

from __future__ import annotations

import pytest
from torch import nn

from models.checkpoint_errors import CheckpointError
from models.checkpoint_meta import check_meta, intensity_scales, make_meta
from models.checkpoints import load_state_exact
from models.labels import NUM_CLASSES


def test_a_voxel_size_of_zero_is_refused():
    assert check_meta(make_meta(voxel_size=0.1), NUM_CLASSES)["voxel_size"] == 0.1
    for bad in (0, 0.0, -0.05):
        with pytest.raises(CheckpointError, match="voxel_size"):
            check_meta(make_meta(voxel_size=bad), NUM_CLASSES)


def test_an_intensity_rule_dividing_by_zero_is_a_checkpoint_error():
    assert intensity_scales({"kitti": "0-1", "ouster": "0-255 -> /255"}) == {
        "kitti": 1.0,
        "ouster": 1 / 255,
    }
    for rule in ("0-255 -> /0", "0-255 -> /0.0"):
        with pytest.raises(CheckpointError, match="intensity_normalisation"):
            intensity_scales({"ouster": rule})
        with pytest.raises(CheckpointError, match="intensity_normalisation"):
            check_meta(make_meta(intensity_normalisation={"ouster": rule}), NUM_CLASSES)


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_a_weight_that_is_not_finite_is_refused(bad):
    model = nn.Linear(3, 2)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    load_state_exact(model, state, "ok.pt")
    state["weight"][1, 2] = bad
    with pytest.raises(CheckpointError, match="'weight' holds NaN or infinite values"):
        load_state_exact(model, state, "bad.pt")
