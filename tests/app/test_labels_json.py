"""The direct label-list encoder against json.dumps."""

import json

import numpy as np
import pytest

from app.codecs.labels import labels_json


@pytest.mark.parametrize(
    "labels",
    [
        np.zeros(0, np.uint8),
        np.array([7], np.uint8),
        np.arange(256, dtype=np.uint8),
        np.random.default_rng(0).integers(0, 256, 100_000, np.uint8),
    ],
)
def test_labels_json_is_json_dumps(labels):
    assert labels_json(labels) == json.dumps(labels.tolist(), separators=(",", ":")).encode()
    assert json.loads(labels_json(labels)) == labels.tolist()


def test_labels_json_wants_uint8():
    with pytest.raises(TypeError):
        labels_json(np.array([1, 2], np.int64))
