"""Real labelled frames for training: their roles, loading, and an instance bank.

ROLES mirrors the roles table of ../shared/data/real/SOURCES.md (one home in the code) for the
shared SemanticKITTI folder: frames in the training pool may feed gradients; validation frames
are only for model selection and reporting, and `check_training_frames` refuses them (and
anything not in the table) in a training list. A folder of a team's own labelled scans (`.bin`
and `.label` in SemanticKITTI's layout, `train.train --real-dir`) names its frames' roles in its
own ROLES_FILE, and the same rules hold there.
"""

from __future__ import annotations

import functools
import json
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
ROLES_FILE = "roles.json"  # {"frame": "training pool" | "validation", ...} in a folder of scans


def is_shared(real_dir: str | Path) -> bool:
    """Whether `real_dir` is the shared SemanticKITTI folder (ROLES), not a team's own."""
    return Path(real_dir).resolve() == REAL_DIR.resolve()


@functools.lru_cache(maxsize=8)
def roles_of(real_dir: str = str(REAL_DIR)) -> dict[str, str]:
    """Each frame's role in `real_dir`: ROLES for the shared folder, else its ROLES_FILE (every
    frame named there must have its .bin and .label); ValueError saying what is wrong."""
    if is_shared(real_dir):
        return ROLES
    path = Path(real_dir) / ROLES_FILE
    try:
        roles = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(
            f"{path} is missing: a folder of your own labelled scans names each frame's role "
            f'there, {{"frame": "{TRAIN}" | "{VALIDATION}"}} (validation frames never train)'
        ) from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    if not isinstance(roles, dict) or not roles:
        raise ValueError(f"{path}: expected an object of frame names and roles")
    for name, role in roles.items():
        if role not in (TRAIN, VALIDATION):
            raise ValueError(f"{path}: {name!r}: role {role!r} is not {TRAIN!r} or {VALIDATION!r}")
        for ext in (".bin", ".label"):
            if not (Path(real_dir) / f"{name}{ext}").is_file():
                raise ValueError(f"{path}: {name!r} has no {name}{ext} beside it")
    return roles


def frames_in_role(role: str, real_dir: str = str(REAL_DIR)) -> tuple[str, ...]:
    return tuple(name for name, r in roles_of(str(real_dir)).items() if r == role)


# classes whose instances may be cut and pasted (SemanticKITTI "things"), and the ground they
# may be pasted onto (our ids: car 0 .. motorcyclist 7; road 8, parking 9, sidewalk 10,
# other-ground 11, terrain 16)
THING_CLASSES = tuple(range(8))
GROUND_CLASSES = (8, 9, 10, 11, 16)


def check_training_frames(names, real_dir: str = str(REAL_DIR)) -> tuple[str, ...]:
    """The names, if every one is a training-pool frame of `real_dir`; ValueError naming the
    first that is not (validation frames are never trained on)."""
    names = tuple(names)
    roles = roles_of(str(real_dir)) if names else ROLES
    for name in names:
        role = roles.get(name)
        if role != TRAIN:
            why = f"its role is {role!r}" if role else "it is not in the roles table"
            table = "see SOURCES.md" if is_shared(real_dir) else f"{real_dir}/{ROLES_FILE}"
            pool = ", ".join(frames_in_role(TRAIN, str(real_dir)))
            raise ValueError(
                f"real frame {name!r} may not be used for training: {why} "
                f"(training pool: {pool}; {table})"
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
    check_training_frames([name], real_dir)
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
        i
        for n in check_training_frames(names, real_dir)
        for i in instances_of(n, real_dir=real_dir)
    )
