"""app/inference/scoring.py at its edges: a ground truth of exactly num_classes, a class only
predicted, a point the pipeline ignored (255) in the accuracy."""

from __future__ import annotations

import numpy as np
import pytest

from app.inference.scoring import confusion, iou_metrics

NAMES = ["a", "b", "c", "d"]


def test_a_ground_truth_id_of_num_classes_is_dropped():
    conf = confusion(np.array([0, 4, 1]), np.array([0, 0, 1]), 4)
    assert conf.shape == (4, 5) and int(conf.sum()) == 2
    assert conf[0, 0] == 1 and conf[1, 1] == 1


def test_a_class_only_predicted_is_no_term_of_the_miou():
    """IoU over the classes present in the ground truth: a class only predicted counts as a
    false positive of the true class, not as a class of IoU 0."""
    m = iou_metrics(np.array([0, 0]), np.array([0, 1]), NAMES)
    assert m["per_class_iou"] == pytest.approx({"a": 0.5})
    assert m["miou"] == pytest.approx(0.5)


def test_a_point_the_pipeline_ignored_counts_against_the_accuracy():
    m = iou_metrics(np.array([0, 0, 1, 1]), np.array([0, 255, 1, 255]), NAMES)
    assert m["accuracy"] == pytest.approx(0.5) and m["num_scored"] == 4
    assert m["per_class_iou"] == pytest.approx({"a": 0.5, "b": 0.5})
