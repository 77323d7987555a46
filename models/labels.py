"""The label space: SemanticKITTI's 19 classes (names, colours), the ignore id, and the learning
map from raw SemanticKITTI ids. The one home of these facts: checkpoints, the pipeline, scoring,
the service, training and the synthetic scenes all read them from here.

Class ids are 0..18 (car = 0 ... traffic-sign = 18); IGNORE_LABEL (255) marks a point with no
class: ignored by the pipeline (non-finite, out of range) or unlabelled in the ground truth.
"""

from __future__ import annotations

import numpy as np

IGNORE_LABEL = 255

SEMANTIC_KITTI_CLASSES: tuple[str, ...] = (
    "car",
    "bicycle",
    "motorcycle",
    "truck",
    "other-vehicle",
    "person",
    "bicyclist",
    "motorcyclist",
    "road",
    "parking",
    "sidewalk",
    "other-ground",
    "building",
    "fence",
    "vegetation",
    "trunk",
    "terrain",
    "pole",
    "traffic-sign",
)
NUM_CLASSES = len(SEMANTIC_KITTI_CLASSES)
# RGB, the palette mmdetection3d's SemanticKittiDataset uses (the semantic-kitti-api colour map,
# which is BGR there, in RGB order).
SEMANTIC_KITTI_COLORS: tuple[tuple[int, int, int], ...] = (
    (100, 150, 245),
    (100, 230, 245),
    (30, 60, 150),
    (80, 30, 180),
    (100, 80, 250),
    (155, 30, 30),
    (255, 40, 200),
    (150, 30, 90),
    (255, 0, 255),
    (255, 150, 255),
    (75, 0, 75),
    (175, 0, 75),
    (255, 200, 0),
    (255, 120, 50),
    (0, 175, 0),
    (135, 60, 0),
    (150, 240, 80),
    (255, 240, 150),
    (255, 0, 0),
)

# semantic-kitti.yaml learning_map: raw id -> 0..19 (0 = ignore); unknown raw ids -> 0
LEARNING_MAP: dict[int, int] = {
    0: 0,
    1: 0,
    10: 1,
    11: 2,
    13: 5,
    15: 3,
    16: 5,
    18: 4,
    20: 5,
    30: 6,
    31: 7,
    32: 8,
    40: 9,
    44: 10,
    48: 11,
    49: 12,
    50: 13,
    51: 14,
    52: 0,
    60: 9,
    70: 15,
    71: 16,
    72: 17,
    80: 18,
    81: 19,
    99: 0,
    252: 1,
    253: 7,
    254: 6,
    255: 8,
    256: 5,
    257: 5,
    258: 4,
    259: 5,
}


def learning_lut() -> np.ndarray:
    """uint8 [65536]: raw 16-bit semantic id -> our class id 0..18, or IGNORE_LABEL."""
    lut = np.full(1 << 16, IGNORE_LABEL, np.uint8)
    for raw, learned in LEARNING_MAP.items():
        lut[raw] = IGNORE_LABEL if learned == 0 else learned - 1
    return lut


def map_raw_labels(raw: np.ndarray) -> np.ndarray:
    """Our class ids (uint8, IGNORE_LABEL for none) of raw SemanticKITTI labels (uint32: the
    lower 16 bits are the semantic id, the upper the instance)."""
    return learning_lut()[np.asarray(raw).astype(np.uint32) & 0xFFFF]


def class_counts(labels: np.ndarray, names: list[str] | tuple[str, ...]) -> dict[str, int]:
    """{class name: points} for the classes present, plus "ignore" for IGNORE_LABEL points."""
    counts = np.bincount(np.asarray(labels, np.uint8), minlength=256)
    out = {names[i]: int(counts[i]) for i in range(len(names)) if counts[i]}
    if counts[IGNORE_LABEL]:
        out["ignore"] = int(counts[IGNORE_LABEL])
    return out
