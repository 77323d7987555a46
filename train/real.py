"""Real labelled SemanticKITTI frames for training: their roles, loading, and an instance bank.

ROLES mirrors the roles table of ../shared/data/real/SOURCES.md (one home in the code): frames in
the training pool may feed gradients; validation frames are only for model selection and
reporting, and `check_training_frames` refuses them (and anything not in the table) in a
training list.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.inference.scoring import map_raw_labels

REAL_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "real" / "semantickitti"

TRAIN, VALIDATION, TESTS_ONLY = "training pool", "validation", "tests only"
ROLES = {
    **{f"seq04_{i:06d}": TRAIN for i in range(6)},
    "seq00_000100": TRAIN,
    "seq00_000000": VALIDATION,
    "spvnas_000000": VALIDATION,
    "seq00_000000_subset50": TESTS_ONLY,
}
TRAINING_POOL = tuple(k for k, v in ROLES.items() if v == TRAIN)
VALIDATION_FRAMES = tuple(k for k, v in ROLES.items() if v == VALIDATION)

# classes whose instances may be cut and pasted (SemanticKITTI "things"), and the ground they
# may be pasted onto (our ids: car 0 .. motorcyclist 7; road 8, parking 9, sidewalk 10,
# other-ground 11, terrain 16)
THING_CLASSES = tuple(range(8))
GROUND_CLASSES = (8, 9, 10, 11, 16)


def check_training_frames(names) -> tuple[str, ...]:
    """The names, if every one is a training-pool frame; ValueError naming the first that is not
    (validation frames are never trained on)."""
    names = tuple(names)
    for name in names:
        role = ROLES.get(name)
        if role != TRAIN:
            why = f"its role is {role!r}" if role else "it is not in the roles table"
            raise ValueError(
                f"real frame {name!r} may not be used for training: {why} "
                f"(training pool: {', '.join(TRAINING_POOL)}; see SOURCES.md)"
            )
    return names


@functools.lru_cache(maxsize=16)
def load_real(
    name: str, real_dir: str = str(REAL_DIR)
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(points float32 [N, 4], labels uint8 [N] our ids / 255, instance uint32 [N]) of a
    labelled frame, read-only. Instance = raw label >> 16 (0: none)."""
    base = Path(real_dir) / name
    points = np.fromfile(base.with_suffix(".bin"), np.float32).reshape(-1, 4)
    raw = np.fromfile(base.with_suffix(".label"), np.uint32)
    if len(raw) != len(points):
        raise ValueError(f"{name}: {len(points)} points but {len(raw)} labels")
    out = points, map_raw_labels(raw), raw >> 16
    for a in out:
        a.flags.writeable = False
    return out


@dataclass(frozen=True)
class Instance:
    points: np.ndarray  # float32 [K, 4], in the sensor frame of its source scan
    label: int  # our class id (a thing class)
    source: str  # the frame it was cut from


def instances_of(
    name: str, min_points: int = 30, max_extent: float = 12.0, real_dir: str = str(REAL_DIR)
) -> list[Instance]:
    """Every labelled thing instance (instance id > 0, thing class, >= min_points points, at
    most max_extent metres across in x and y) of a training-pool frame."""
    check_training_frames([name])
    points, labels, inst = load_real(name, real_dir)
    out = []
    keep = (inst > 0) & np.isin(labels, THING_CLASSES)
    keys = inst.astype(np.int64) * 256 + labels
    for key in np.unique(keys[keep]):
        rows = np.flatnonzero(keep & (keys == key))
        extent = np.ptp(points[rows, :2], axis=0).max() if len(rows) else 0.0
        if len(rows) >= min_points and extent <= max_extent:
            out.append(Instance(points[rows].copy(), int(key % 256), name))
    return out


@functools.lru_cache(maxsize=4)
def instance_bank(names: tuple[str, ...], real_dir: str = str(REAL_DIR)) -> tuple[Instance, ...]:
    return tuple(
        i for n in check_training_frames(names) for i in instances_of(n, real_dir=real_dir)
    )
