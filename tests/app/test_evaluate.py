"""`python -m app evaluate`: IoU oracle on hand-computed values, the label map, a real frame."""

from __future__ import annotations


import numpy as np
import pytest

from app.inference.scoring import iou_metrics, map_raw_labels
from tests.conftest import last_json_line, require_real_data, run_app


def test_iou_against_hand_computed_values():
    names = ["a", "b", "c", "d"]
    gt = np.array([0, 0, 1, 1, 2, 255], np.uint8)
    pred = np.array([0, 1, 1, 1, 0, 3], np.uint8)
    m = iou_metrics(gt, pred, names)
    # a: TP 1, GT 2, predicted 2 -> 1/3; b: TP 2, GT 2, predicted 3 -> 2/3; c: 0; d absent from GT
    assert m["per_class_iou"] == pytest.approx({"a": 1 / 3, "b": 2 / 3, "c": 0.0})
    assert m["miou"] == pytest.approx(1 / 3)
    assert m["accuracy"] == pytest.approx(3 / 5)
    assert m["num_points"] == 6
    # a prediction of 255 (point ignored by the pipeline) is a miss for its class
    m = iou_metrics(np.array([0, 0]), np.array([0, 255]), names)
    assert m["per_class_iou"] == pytest.approx({"a": 0.5})


def test_learning_map():
    raw = np.array([10, 40, 81, 0, 52, (7 << 16) | 10, 252, 60, 99, 1234], np.uint32)
    assert map_raw_labels(raw).tolist() == [0, 8, 18, 255, 255, 0, 0, 8, 255, 255]


def test_evaluate_real_frame():
    d = require_real_data() / "semantickitti"
    frame, labels = d / "seq00_000000_subset50.bin", d / "seq00_000000_subset50.label"
    if not (frame.is_file() and labels.is_file()):
        pytest.skip(f"missing {frame} / {labels}")
    out = run_app(
        "evaluate",
        str(frame),
        str(labels),
        "--weights",
        "random",
        "--cr",
        "0.25",
        "--device",
        "cpu",
    )
    result = last_json_line(out.stdout)
    assert 0.0 <= result["miou"] <= 1.0 and 0.0 <= result["accuracy"] <= 1.0
    assert result["num_points"] == 50 and result["per_class_iou"]
    assert all(0.0 <= v <= 1.0 for v in result["per_class_iou"].values())
