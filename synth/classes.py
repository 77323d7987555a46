"""The SemanticKITTI 19 training classes (models/labels.py) and the raw label ids synthetic
scenes write for them."""

from __future__ import annotations

# re-exported: IGNORE marks nothing hit / unlabelled
from models.labels import IGNORE_LABEL as IGNORE  # noqa: F401
from models.labels import NUM_CLASSES
from models.labels import SEMANTIC_KITTI_CLASSES as CLASS_NAMES  # noqa: F401

(
    CAR,
    BICYCLE,
    MOTORCYCLE,
    TRUCK,
    OTHER_VEHICLE,
    PERSON,
    BICYCLIST,
    MOTORCYCLIST,
    ROAD,
    PARKING,
    SIDEWALK,
    OTHER_GROUND,
    BUILDING,
    FENCE,
    VEGETATION,
    TRUNK,
    TERRAIN,
    POLE,
    TRAFFIC_SIGN,
) = range(NUM_CLASSES)

# raw SemanticKITTI ids (semantic-kitti.yaml), the ones the standard learning map turns into the
# training ids above
TRAIN_TO_RAW = {
    CAR: 10,
    BICYCLE: 11,
    MOTORCYCLE: 15,
    TRUCK: 18,
    OTHER_VEHICLE: 20,
    PERSON: 30,
    BICYCLIST: 31,
    MOTORCYCLIST: 32,
    ROAD: 40,
    PARKING: 44,
    SIDEWALK: 48,
    OTHER_GROUND: 49,
    BUILDING: 50,
    FENCE: 51,
    VEGETATION: 70,
    TRUNK: 71,
    TERRAIN: 72,
    POLE: 80,
    TRAFFIC_SIGN: 81,
}
RAW_LANE_MARKING = 60  # learning map: lane-marking -> road
RAW_UNLABELED = 0
