"""The label-list kernel (csrc/labels_cpu.cpp) against json.dumps, its oracle: every value's
text, empty and long lists, and lists read from non-contiguous arrays."""

import json

import numpy as np
import pytest

from kernels.labels import labels_json


@pytest.mark.parametrize(
    "labels",
    [
        np.zeros(0, np.uint8),
        np.array([7], np.uint8),
        np.arange(256, dtype=np.uint8),
        np.random.default_rng(0).integers(0, 256, 100_000, np.uint8),
        np.array([255, 0, 99, 100, 9, 10], np.uint8),  # every text length, at both ends
        np.arange(512, dtype=np.uint8)[::3],  # a strided view
        np.full((3, 4), 18, np.uint8),  # any shape, in C order
    ],
)
def test_labels_json_is_json_dumps(labels):
    flat = labels.ravel().tolist()
    assert labels_json(labels) == json.dumps(flat, separators=(",", ":")).encode()
    assert json.loads(labels_json(labels)) == flat


def test_labels_json_wants_uint8():
    with pytest.raises(TypeError):
        labels_json(np.array([1, 2], np.int64))
