"""models/checkpoints.py, models/checkpoint_meta.py and models/labels.py at what the suite never
reached: an input feature count other than the first conv's, a weight of the wrong shape, and raw
SemanticKITTI ids against their known classes."""

from __future__ import annotations

import numpy as np
import pytest

from models.checkpoint_errors import CheckpointError
from models.checkpoint_meta import check_meta, make_meta
from models.checkpoints import load_state_exact
from models.labels import IGNORE_LABEL, map_raw_labels
from tests.models.checkpoint_helpers import random_minkunet


def test_the_input_features_must_be_the_first_convs_in_channels():
    meta = make_meta(input_features=("x", "y", "z"))
    assert check_meta(meta, 19)["input_features"] == ["x", "y", "z"]
    with pytest.raises(CheckpointError, match="has 3 features .* in_channels is 4"):
        check_meta(meta, 19, in_channels=4)


@pytest.fixture(scope="module")
def model():
    return random_minkunet()


def test_a_weight_of_another_shape_is_a_checkpoint_error(model):
    state = dict(model.state_dict())
    state["head.weight"] = state["head.weight"][:, :-1]
    with pytest.raises(CheckpointError, match="'head.weight' has shape"):
        load_state_exact(model, state, "here")


def test_raw_semantic_kitti_ids_map_to_their_classes():
    """car 10 -> 0, road 40 -> 8, traffic-sign 81 -> 18 (learning map 1..19 minus one); the
    instance in the upper 16 bits is dropped; unlabelled 0 and outlier 1 are ignored."""
    raw = np.array([10, 40, 81, (7 << 16) | 10, 0, 1, 252], np.uint32)
    assert map_raw_labels(raw).tolist() == [0, 8, 18, 0, IGNORE_LABEL, IGNORE_LABEL, 0]
