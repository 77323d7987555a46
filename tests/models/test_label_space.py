"""models/labels.py: class_counts names every class, the last one included, and "ignore"."""

from __future__ import annotations

import numpy as np

from models.labels import IGNORE_LABEL, SEMANTIC_KITTI_CLASSES, class_counts


def test_class_counts_cover_the_first_and_last_class_and_ignore():
    labels = np.array([0, 18, 18, IGNORE_LABEL, 8], np.uint8)
    assert class_counts(labels, SEMANTIC_KITTI_CLASSES) == {
        "car": 1,
        "road": 1,
        "traffic-sign": 2,
        "ignore": 1,
    }
    assert class_counts(np.zeros(0, np.uint8), SEMANTIC_KITTI_CLASSES) == {}
